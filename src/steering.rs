//! SO_REUSEPORT connection steering: a classic BPF program that hands each new connection to
//! the shard running on the CPU that received its SYN.
//!
//! With RSS and one queue IRQ per shard CPU (`scripts/irq-affinity.sh`), the CPU that receives a
//! connection's packets runs its shard, so the connection never crosses cores: the softirq, the
//! accept, the reads and the sends all stay on one core and one NUMA node.
//!
//! The kernel runs the program once per incoming SYN for the whole SO_REUSEPORT group and uses
//! its return value as an index into the group's sockets. TCP sockets join the group when they
//! start listening, so index = order of `listen()` = shard index when shards listen in order.
//! (When a socket in the group closes, the kernel moves the last socket into its slot: restart
//! the whole group rather than one shard.) An index past the group's size makes the kernel
//! fall back to its hash, so a bad program degrades to plain SO_REUSEPORT, never to a drop.
//!
//! Restart handover (two processes in one group). The group is ordered: the running process's
//! n sockets hold indices 0..n (in some order), a successor that binds the same address
//! appends its m sockets at n..n+m in its listen order; when a socket closes, the last one
//! takes its index. So:
//! - a process that finds another process's listeners in its group at start-up does not attach
//!   its table (indices 0..n are not its sockets); the running program keeps steering to the
//!   old process, which is still serving;
//! - the old process, at SIGTERM, attaches `handover_program`: the same table shifted by n,
//!   so new connections go to the successor's socket for their CPU and none to the old
//!   sockets, which are then closed without a backlog to lose;
//! - once the old sockets are gone, every index the shifted table returns is past the group's
//!   end: the kernel falls back to its hash, which honours SO_INCOMING_CPU (Linux 6.2+, set on
//!   every listener by `server`): still the socket of the receiving CPU, whatever order the
//!   closes left the group in. The next handover shifts by the group's size again.

use libc::sock_filter;

/// Instructions the program spends per shard (a compare and a return).
const INSNS_PER_SHARD: usize = 2;
/// Instructions outside the per-shard table (the CPU load, the modulo, the handover offset,
/// the final return).
const INSNS_FIXED: usize = 4;
/// Classic BPF's instruction limit (`BPF_MAXINSNS`).
const INSNS_MAX: usize = 4096;
/// Shards the lookup table can hold within `BPF_MAXINSNS`; CPUs of later shards take the
/// fallback path (far beyond any core count we deploy on).
pub const STEERING_SHARDS_MAX: usize = (INSNS_MAX - INSNS_FIXED) / INSNS_PER_SHARD;

const _: () = assert!(INSNS_FIXED + STEERING_SHARDS_MAX * INSNS_PER_SHARD <= INSNS_MAX);
const _: () = assert!(libc::BPF_MAXINSNS as usize == INSNS_MAX);

/// `BPF_LD | BPF_W | BPF_ABS`: load a 32-bit word at an absolute offset (here: ancillary data).
pub const OP_LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
/// `BPF_JMP | BPF_JEQ | BPF_K`: compare A with a constant.
pub const OP_JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
/// `BPF_RET | BPF_K`: return a constant.
pub const OP_RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
/// `BPF_RET | BPF_A`: return the accumulator.
pub const OP_RET_A: u16 = (libc::BPF_RET | libc::BPF_A) as u16;
/// `BPF_ALU | BPF_ADD | BPF_K`: A += constant.
pub const OP_ADD_K: u16 = (libc::BPF_ALU | libc::BPF_ADD | libc::BPF_K) as u16;
/// `BPF_ALU | BPF_MOD | BPF_K`: A %= constant.
pub const OP_MOD_K: u16 = (libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K) as u16;
/// Offset of the "current CPU" ancillary word (`SKF_AD_OFF + SKF_AD_CPU`), as the unsigned
/// `k` the instruction carries.
pub const SKF_CPU_OFFSET: u32 = (libc::SKF_AD_OFF + libc::SKF_AD_CPU) as u32;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// Builds the steering program: shard `i` is the socket index for CPU `shard_cpus[i]`; a CPU
/// with no shard maps to `cpu % shard_cpus.len()` so it is still spread deterministically.
///
/// Shape: `A = cpu; if A == c0 return 0; if A == c1 return 1; ...; return A % n`. Each compare
/// jumps at most one instruction, so the 8-bit jump offsets never overflow whatever `n` is.
/// A CPU listed twice goes to its first shard.
pub fn reuseport_cbpf_program(shard_cpus: &[usize]) -> Vec<sock_filter> {
    shifted_program(shard_cpus, 0)
}

/// The program an old process attaches at SIGTERM when `successor` sockets of a new process
/// follow its own `own` sockets in the group: CPU -> the successor's shard on that CPU (index
/// `own + shard`), assuming the successor runs the same plan as `own_cpus` when it has as many
/// shards (a restart), else shard `cpu % successor`. No index below `own` is ever returned.
pub fn handover_program(own: usize, successor: usize, own_cpus: &[usize]) -> Vec<sock_filter> {
    let cpus: Vec<usize> = if successor == own_cpus.len() {
        own_cpus.to_vec()
    } else {
        (0..successor).collect()
    };
    shifted_program(&cpus, u32::try_from(own).unwrap_or(u32::MAX))
}

/// The table program with `offset` added to every index it returns.
fn shifted_program(shard_cpus: &[usize], offset: u32) -> Vec<sock_filter> {
    if shard_cpus.is_empty() {
        return vec![insn(OP_RET_K, 0, 0, offset)];
    }
    let table = &shard_cpus[..shard_cpus.len().min(STEERING_SHARDS_MAX)];
    let mut program = Vec::with_capacity(INSNS_FIXED + table.len() * INSNS_PER_SHARD);
    program.push(insn(OP_LD_W_ABS, 0, 0, SKF_CPU_OFFSET));
    for (shard, &cpu) in table.iter().enumerate() {
        // A CPU id that does not fit the 32-bit register can never be loaded: no entry needed.
        let Ok(cpu) = u32::try_from(cpu) else {
            continue;
        };
        // `shard` < STEERING_SHARDS_MAX, far below u32::MAX.
        let index = u32::try_from(shard).unwrap_or(u32::MAX);
        program.push(insn(OP_JEQ_K, 0, 1, cpu));
        program.push(insn(OP_RET_K, 0, 0, index.saturating_add(offset)));
    }
    let modulus = u32::try_from(shard_cpus.len()).unwrap_or(u32::MAX);
    program.push(insn(OP_MOD_K, 0, 0, modulus));
    if offset > 0 {
        program.push(insn(OP_ADD_K, 0, 0, offset));
    }
    program.push(insn(OP_RET_A, 0, 0, 0));
    program
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Runs `program` the way the kernel's classic BPF interpreter would for a packet received
    /// on `cpu`, supporting exactly the opcodes we emit; `Err` for anything the kernel's
    /// checker would refuse (unknown opcode, jump out of range, division by zero, no return).
    fn run(program: &[sock_filter], cpu: u32) -> Result<u32, String> {
        let mut acc: u32 = 0;
        let mut pc = 0usize;
        // Classic BPF only jumps forward, so a program runs at most its length in steps.
        for _ in 0..=program.len() {
            let insn = program.get(pc).ok_or(format!("pc {pc} past the end"))?;
            pc += 1;
            match insn.code {
                OP_LD_W_ABS if insn.k == SKF_CPU_OFFSET => acc = cpu,
                OP_LD_W_ABS => return Err(format!("unexpected load offset {:#x}", insn.k)),
                OP_JEQ_K => {
                    pc += usize::from(if acc == insn.k { insn.jt } else { insn.jf });
                }
                OP_MOD_K if insn.k == 0 => return Err("modulo by zero".to_string()),
                OP_MOD_K => acc %= insn.k,
                OP_ADD_K => acc = acc.wrapping_add(insn.k),
                OP_RET_K => return Ok(insn.k),
                OP_RET_A => return Ok(acc),
                code => return Err(format!("unsupported opcode {code:#x}")),
            }
        }
        Err("no return".to_string())
    }

    fn expected(shard_cpus: &[usize], cpu: usize) -> u32 {
        match shard_cpus.iter().position(|&c| c == cpu) {
            Some(index) => index as u32,
            None => (cpu % shard_cpus.len()) as u32,
        }
    }

    fn check(shard_cpus: &[usize]) {
        let program = reuseport_cbpf_program(shard_cpus);
        assert!(program.len() <= INSNS_MAX);
        for cpu in 0..256 {
            assert_eq!(
                run(&program, cpu as u32),
                Ok(expected(shard_cpus, cpu)),
                "plan {shard_cpus:?}, cpu {cpu}"
            );
        }
    }

    #[test]
    fn identity_plan_returns_the_cpu() {
        check(&[0, 1]);
        check(&[0, 1, 2, 3, 4, 5, 6, 7]);
    }

    #[test]
    fn nic_local_plan_on_the_second_socket() {
        // Shards on CPUs 4-7: CPU 5's connections go to shard 1; CPU 2 (no shard) to 2 % 4.
        let program = reuseport_cbpf_program(&[4, 5, 6, 7]);
        assert_eq!(run(&program, 5), Ok(1));
        assert_eq!(run(&program, 2), Ok(2));
        assert_eq!(run(&program, 9), Ok(1));
        check(&[4, 5, 6, 7]);
    }

    #[test]
    fn sparse_reversed_and_duplicate_plans() {
        check(&[3, 1]);
        check(&[0, 8, 1, 9]);
        check(&[7]);
        check(&[2, 2, 5]);
        assert_eq!(run(&reuseport_cbpf_program(&[2, 2, 5]), 2), Ok(0));
    }

    #[test]
    fn empty_plan_returns_zero() {
        assert_eq!(run(&reuseport_cbpf_program(&[]), 3), Ok(0));
    }

    #[test]
    fn program_shape_is_what_the_kernel_expects() {
        let program = reuseport_cbpf_program(&[4, 5]);
        let codes: Vec<u16> = program.iter().map(|i| i.code).collect();
        assert_eq!(
            codes,
            vec![
                OP_LD_W_ABS,
                OP_JEQ_K,
                OP_RET_K,
                OP_JEQ_K,
                OP_RET_K,
                OP_MOD_K,
                OP_RET_A
            ]
        );
        assert_eq!(
            program[0].k, 0xffff_f024,
            "SKF_AD_OFF (-0x1000) + SKF_AD_CPU (36)"
        );
    }

    #[test]
    fn huge_plans_stay_within_the_instruction_limit() {
        // Shard i on CPU i + 1, more shards than the table holds.
        let cpus: Vec<usize> = (1..=5000).collect();
        let program = reuseport_cbpf_program(&cpus);
        assert!(program.len() <= INSNS_MAX);
        assert_eq!(run(&program, 18), Ok(17));
        // Past the table the fallback takes over: still a valid index, if not the exact shard.
        assert_eq!(run(&program, 3001), Ok(3001));
        assert!(run(&program, 4999).unwrap() < 5000);
    }

    #[test]
    fn handover_program_steers_to_the_successor_only() {
        // Old process: shards on CPUs 4-7 at indices 0..4; the successor appended at 4..8.
        let cpus = [4, 5, 6, 7];
        let program = handover_program(4, 4, &cpus);
        for cpu in 0..64u32 {
            let want = 4 + expected(&cpus, cpu as usize);
            assert_eq!(run(&program, cpu), Ok(want), "cpu {cpu}");
        }
        // A successor with another shard count: still only its indices.
        let program = handover_program(4, 2, &cpus);
        for cpu in 0..64u32 {
            let i = run(&program, cpu).unwrap();
            assert!((4..6).contains(&i), "cpu {cpu} -> {i}");
        }
        assert_eq!(run(&handover_program(3, 0, &[1, 2, 3]), 1), Ok(3));
    }

    proptest! {
        #[test]
        fn every_cpu_maps_to_its_shard_or_the_fallback(
            cpus in proptest::collection::vec(0usize..128, 1..64),
            probe in 0u32..512,
        ) {
            let program = reuseport_cbpf_program(&cpus);
            prop_assert_eq!(run(&program, probe), Ok(expected(&cpus, probe as usize)));
            let index = run(&program, probe).unwrap();
            prop_assert!((index as usize) < cpus.len());
        }
    }
}
