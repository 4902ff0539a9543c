//! The field report's kernel settings, read from `proc/sys` under the root. The same values are
//! applied by `scripts/tune-host.sh`; keep the two lists in step.

use super::host::Tree;
use super::{Check, Status};

/// What a sysctl should be.
#[derive(Debug, Clone, Copy)]
enum Want {
    /// A number at least this big (bigger is fine: never tell anyone to lower a maximum).
    AtLeast(u64),
    /// Exactly this value.
    Exactly(&'static str),
    /// `net.ipv4.tcp_wmem`-style "min default max" with lower bounds on default and max.
    Triple { default_min: u64, max_min: u64 },
}

/// One recommended sysctl.
struct Spec {
    key: &'static str,
    want: Want,
    recommended: &'static str,
    why: &'static str,
}

/// 16 MiB: about the bandwidth-delay product of one 10 Gbit/s stream at 13 ms RTT.
const SOCKET_BUFFER_MAX_BYTES: u64 = 16 << 20;

const SPECS: &[Spec] = &[
    Spec {
        key: "net.core.wmem_max",
        want: Want::AtLeast(SOCKET_BUFFER_MAX_BYTES),
        recommended: ">= 16777216",
        why: "caps SO_SNDBUF; 16 MiB is one 10 Gbit/s stream's bandwidth-delay product at 13 ms",
    },
    Spec {
        key: "net.core.rmem_max",
        want: Want::AtLeast(SOCKET_BUFFER_MAX_BYTES),
        recommended: ">= 16777216",
        why: "caps SO_RCVBUF; not in the field report (the edge mostly sends), kept equal to wmem_max",
    },
    Spec {
        key: "net.ipv4.tcp_wmem",
        want: Want::Triple {
            default_min: 1 << 20,
            max_min: SOCKET_BUFFER_MAX_BYTES,
        },
        recommended: "4096 1048576 16777216",
        why: "send-buffer autotuning: the max bounds bytes in flight per connection, 1 MiB default starts bulk fast",
    },
    Spec {
        key: "net.core.somaxconn",
        want: Want::AtLeast(65535),
        recommended: ">= 65535",
        why: "accept-queue cap; connection storms after a patch release overflow it (listen drops)",
    },
    Spec {
        key: "net.core.netdev_max_backlog",
        want: Want::AtLeast(300_000),
        recommended: ">= 300000",
        why: "per-CPU backlog of received packets; 10G bursts overflow the default 1000 (softnet drops)",
    },
    Spec {
        key: "net.ipv4.tcp_congestion_control",
        want: Want::Exactly("bbr"),
        recommended: "bbr",
        why: "keeps one stream near line rate on lossy long paths (8.6 Gbit/s single stream in the field report)",
    },
    Spec {
        key: "net.ipv4.tcp_slow_start_after_idle",
        want: Want::Exactly("0"),
        recommended: "0",
        why: "otherwise a keep-alive connection restarts from a small window after every pause",
    },
    Spec {
        key: "net.ipv4.tcp_notsent_lowat",
        want: Want::Exactly("16384"),
        recommended: "16384",
        why: "bounds unsent bytes per socket so the loop rotates connections sooner (small files stay fast)",
    },
];

/// Path of a sysctl key under `proc/sys`.
pub fn sysctl_path(key: &str) -> String {
    format!("/proc/sys/{}", key.replace('.', "/"))
}

/// Reads a sysctl with its whitespace normalised to single spaces (`tcp_wmem` uses tabs).
pub fn read_sysctl(tree: &Tree, key: &str) -> Result<String, String> {
    tree.read(&sysctl_path(key))
        .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// Whether `current` satisfies `want`; `None` when it cannot be parsed.
fn satisfied(want: Want, current: &str) -> Option<bool> {
    match want {
        Want::AtLeast(min) => current.parse::<u64>().ok().map(|v| v >= min),
        Want::Exactly(value) => Some(current == value),
        Want::Triple {
            default_min,
            max_min,
        } => {
            let fields: Vec<u64> = current
                .split(' ')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            match fields.as_slice() {
                [_, default, max] => Some(*default >= default_min && *max >= max_min),
                _ => None,
            }
        }
    }
}

/// The network sysctls plus `kernel.io_uring_disabled`.
pub fn checks(tree: &Tree) -> Vec<Check> {
    let mut checks: Vec<Check> = SPECS.iter().map(|spec| check_spec(tree, spec)).collect();
    checks.push(io_uring_disabled(tree));
    checks
}

fn check_spec(tree: &Tree, spec: &Spec) -> Check {
    let mut recommended = spec.recommended.to_string();
    let (status, current) = match read_sysctl(tree, spec.key) {
        Err(e) => (Status::Warn, e),
        Ok(current) => match satisfied(spec.want, &current) {
            Some(true) => (Status::Ok, current),
            Some(false) => (Status::Warn, current),
            None => (Status::Warn, format!("unparsable: {current:?}")),
        },
    };
    if spec.key == "net.ipv4.tcp_congestion_control" && status != Status::Ok {
        // Setting bbr fails until the module is loaded; say so instead of a bare "bbr".
        let available = read_sysctl(tree, "net.ipv4.tcp_available_congestion_control");
        if let Ok(list) = available {
            if !list.split(' ').any(|c| c == "bbr") {
                recommended = "bbr (modprobe tcp_bbr first)".into();
            }
        }
    }
    Check::new(spec.key, status, current, recommended, spec.why)
}

/// `kernel.io_uring_disabled`: 0 allows io_uring, 1 only for `io_uring_group`, 2 nobody.
fn io_uring_disabled(tree: &Tree) -> Check {
    const KEY: &str = "kernel.io_uring_disabled";
    let recommended = "0";
    match read_sysctl(tree, KEY) {
        Err(_) => Check::new(
            KEY,
            Status::Ok,
            "absent (kernel before 6.6: io_uring always allowed)",
            recommended,
            "shardline needs io_uring; this knob appeared in Linux 6.6",
        ),
        Ok(v) => {
            let (status, why) = match v.as_str() {
                "0" => (Status::Ok, "io_uring is allowed for every process"),
                "1" => (
                    Status::Warn,
                    "io_uring only for CAP_SYS_ADMIN or kernel.io_uring_group members: run shardline in that group",
                ),
                "2" => (
                    Status::Fail,
                    "io_uring is disabled for everyone: shardline cannot start",
                ),
                _ => (Status::Warn, "unknown value"),
            };
            Check::new(KEY, status, v, recommended, why)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn tree_with(values: &[(&str, &str)]) -> (tempfile::TempDir, Tree) {
        let dir = tempfile::tempdir().unwrap();
        for (key, value) in values {
            let path = dir.path().join(sysctl_path(key).trim_start_matches('/'));
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, format!("{value}\n")).unwrap();
        }
        let tree = Tree::new(dir.path());
        (dir, tree)
    }

    fn find<'a>(checks: &'a [Check], name: &str) -> &'a Check {
        checks.iter().find(|c| c.name == name).unwrap()
    }

    #[test]
    fn thresholds_and_exact_values() {
        assert_eq!(satisfied(Want::AtLeast(10), "10"), Some(true));
        assert_eq!(satisfied(Want::AtLeast(10), "9"), Some(false));
        assert_eq!(satisfied(Want::AtLeast(10), "x"), None);
        assert_eq!(satisfied(Want::Exactly("bbr"), "cubic"), Some(false));
        let t = Want::Triple {
            default_min: 1 << 20,
            max_min: 16 << 20,
        };
        assert_eq!(satisfied(t, "4096 1048576 16777216"), Some(true));
        assert_eq!(satisfied(t, "4096 16384 4194304"), Some(false));
        assert_eq!(satisfied(t, "4096 16384"), None);
        assert_eq!(satisfied(t, "a b c"), None);
    }

    #[test]
    fn tabs_are_normalised_and_bbr_hint_given() {
        let (_dir, tree) = tree_with(&[
            ("net.ipv4.tcp_wmem", "4096\t16384\t4194304"),
            ("net.ipv4.tcp_congestion_control", "cubic"),
            ("net.ipv4.tcp_available_congestion_control", "reno cubic"),
        ]);
        let checks = checks(&tree);
        let wmem = find(&checks, "net.ipv4.tcp_wmem");
        assert_eq!(
            (wmem.status, wmem.current.as_str()),
            (Status::Warn, "4096 16384 4194304")
        );
        let cc = find(&checks, "net.ipv4.tcp_congestion_control");
        assert!(cc.recommended.contains("modprobe tcp_bbr"));
        // Missing files warn, they do not crash.
        assert_eq!(find(&checks, "net.core.somaxconn").status, Status::Warn);
    }

    #[test]
    fn io_uring_disabled_levels() {
        for (value, status) in [("0", Status::Ok), ("1", Status::Warn), ("2", Status::Fail)] {
            let (_dir, tree) = tree_with(&[("kernel.io_uring_disabled", value)]);
            assert_eq!(io_uring_disabled(&tree).status, status, "value {value}");
        }
        let (_dir, tree) = tree_with(&[]);
        assert_eq!(io_uring_disabled(&tree).status, Status::Ok);
    }
}
