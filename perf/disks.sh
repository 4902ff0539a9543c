#!/usr/bin/env bash
# perf/disks.sh: several cache disks under load (issue 43). Three ext4 file systems on loop
# devices over images in /dev/shm (`cache_dirs`), 2 shards, nginx as the origin on loopback,
# Python clients that hash every body against the origin's file:
#   - disk gone: hits on a warm set and cold fills run throughout; the disk holding the most
#     hot objects is shut down (EXT4_IOC_SHUTDOWN) mid-load. Wrong bytes, cut downloads and
#     errors after the shutdown, origin fetches per object of the dead disk, and the p99 of
#     hits on the other disks before and after;
#   - disk stalled: another disk frozen (fsfreeze) during a cold 192 MiB download of an object
#     placed on it (placement computed here as the server computes it): its bytes and time
#     against cache_disk_op_timeout_ms plus the origin's time, the shard threads' file
#     syscalls while frozen (perf trace), and the p99 of hits on the third disk;
#   - disk back: the dead drive swapped for a blank one and brought online while serving
#     (`shardline cache disk online`): its share of 1000 new objects against its weight, and
#     whether any old object moved;
#   - restart with a disk missing: time until every hot object of the others is served,
#     against the same restart with all disks.
# Single-disk throughput is perf/fill-ab.sh's (two builds side by side).
#
#   perf/disks.sh [--bin PATH] [--out FILE]
#
# Needs root (losetup, mkfs.ext4, mount, fsfreeze, perf), nginx, python3. Writes perf/DISKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
source perf/lib.sh
BIN=target/release/shardline
OUT=perf/DISKS.md
while (($#)); do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) die "unknown argument $1 (perf/disks.sh [--bin PATH] [--out FILE])" ;;
  esac
done
[[ $(id -u) == 0 ]] || die "needs root (losetup, mount, fsfreeze)"
[[ -x $BIN ]] || die "no $BIN: cargo build --release"
WORK=$(mktemp -d /dev/shm/shardline-disks.XXXXXX)
chmod 755 "$WORK" # the origin nginx's worker reads beneath it
cleanup() {
  python3 "$WORK/driver.py" cleanup "$WORK" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
cat >"$WORK/driver.py" <<'PYEOF'
import hashlib, http.client, json, math, os, shutil, signal, socket, struct, subprocess, sys
import threading, time

WORK = sys.argv[2]
DISKS = 3
DISK_BYTES = 1 << 30
HOT, HOT_BYTES = 30, 1 << 20
COLD_BYTES = 1 << 20
BACK, BACK_BYTES = 1000, 64 << 10
STALL_BYTES = 192 << 20
MASK = (1 << 64) - 1

def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True).stdout.strip()

def cleanup():
    try:
        os.kill(int(open(f"{WORK}/server.pid").read()), signal.SIGKILL)
    except Exception:
        pass
    for i in range(DISKS):
        m = f"{WORK}/d{i}"
        subprocess.run(["fsfreeze", "--unfreeze", m], capture_output=True)
        subprocess.run(["umount", "-l", m], capture_output=True)
        img = f"{WORK}/d{i}.img"
        for dev in sh("losetup", "-j", img, "-O", "NAME", "-n", check=False).split():
            subprocess.run(["losetup", "-d", dev], capture_output=True)
    try:
        os.kill(int(open(f"{WORK}/nginx.pid").read()), signal.SIGTERM)
    except Exception:
        pass

if sys.argv[1] == "cleanup":
    cleanup(); sys.exit(0)

BIN, OUT = sys.argv[3], sys.argv[4]

def make_disk(i):
    img, m = f"{WORK}/d{i}.img", f"{WORK}/d{i}"
    with open(img, "wb") as f:
        f.truncate(DISK_BYTES)
    dev = sh("losetup", "--find", "--show", "--direct-io=on", img)
    sh("mkfs.ext4", "-q", "-F", dev)
    os.makedirs(m, exist_ok=True)
    sh("mount", "-o", "errors=continue", dev, m)
    return m

def write_object(path, size):
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    with open(path, "wb") as f:
        left = size
        while left:
            b = os.urandom(min(left, 1 << 20))
            f.write(b)
            left -= len(b)
    return hashlib.sha256(open(path, "rb").read()).hexdigest()

# The origin.
ORIGIN = f"{WORK}/origin"
digest = {}
for i in range(HOT):
    digest[f"/pull/hot/{i}"] = write_object(f"{ORIGIN}/pull/hot/{i}", HOT_BYTES)
for i in range(400):
    digest[f"/pull/cold/{i}"] = write_object(f"{ORIGIN}/pull/cold/{i}", COLD_BYTES)
for i in range(BACK):
    digest[f"/pull/back/{i}"] = write_object(f"{ORIGIN}/pull/back/{i}", BACK_BYTES)
os.makedirs(f"{WORK}/nginx", exist_ok=True)
open(f"{WORK}/nginx/nginx.conf", "w").write(f"""daemon on; master_process on; worker_processes 1;
pid {WORK}/nginx.pid; error_log {WORK}/nginx/error.log;
events {{ worker_connections 1024; }}
http {{ log_format u '$uri'; access_log {WORK}/nginx/access.log u; sendfile on;
  client_body_temp_path {WORK}/nginx; proxy_temp_path {WORK}/nginx; fastcgi_temp_path {WORK}/nginx;
  uwsgi_temp_path {WORK}/nginx; scgi_temp_path {WORK}/nginx;
  server {{ listen 127.0.0.1:18181; root {ORIGIN}; location / {{ }} }} }}
""")
sh("nginx", "-p", f"{WORK}/nginx", "-c", f"{WORK}/nginx/nginx.conf")

def origin_fetches():
    try:
        lines = open(f"{WORK}/nginx/access.log").read().split()
    except FileNotFoundError:
        return {}
    out = {}
    for u in lines:
        out[u] = out.get(u, 0) + 1
    return out

mounts = [make_disk(i) for i in range(DISKS)]
TOKEN = f"{WORK}/admin.token"
with open(TOKEN, "w") as f:
    f.write(os.urandom(16).hex() + "\n")
os.chmod(TOKEN, 0o600)

def replace_disk(i):
    """The drive of disk i swapped for a blank one, mounted where it was."""
    m, img = mounts[i], f"{WORK}/d{i}.img"
    sh("umount", "-l", m)
    for dev in sh("losetup", "-j", img, "-O", "NAME", "-n", check=False).split():
        sh("losetup", "-d", dev)
    os.remove(img)
    make_disk(i)
ROOT = f"{WORK}/root"
os.makedirs(ROOT, exist_ok=True)
server = None

def start(disks):
    global server
    cfg = f"{WORK}/shardline.toml"
    open(cfg, "w").write("cache_dirs = [%s]\nadmin = \"127.0.0.1:18182\"\nadmin_token_file = \"%s\"\n"
                         "[[origin]]\nprefix = \"/pull/\"\nurl = \"http://127.0.0.1:18181\"\n"
                         % (", ".join(f'"{d}"' for d in disks), TOKEN))
    log = open(f"{WORK}/server.log", "a")
    try:
        # SO_REUSEPORT would let a stray server share the port: refuse to start beside one.
        socket.create_connection(("127.0.0.1", 18180), 0.2).close()
        raise SystemExit("something listens on 127.0.0.1:18180 already")
    except OSError:
        pass
    t0 = time.monotonic()
    server = subprocess.Popen([BIN, "serve", "--root", ROOT, "--listen", "127.0.0.1:18180",
                               "--shards", "2", "--config", cfg], stdout=log, stderr=log,
                              env=dict(os.environ, RUST_LOG="info"))
    open(f"{WORK}/server.pid", "w").write(str(server.pid))
    while True:
        try:
            socket.create_connection(("127.0.0.1", 18180), 0.2).close()
            return t0
        except OSError:
            if time.monotonic() - t0 > 60:
                raise SystemExit("the server did not start")
            time.sleep(0.01)

def stop():
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(20)
    except subprocess.TimeoutExpired:
        server.kill(); server.wait()

def get(path, timeout=30):
    """(status, right bytes?, whole?, seconds); status 0: no response."""
    t = time.monotonic()
    try:
        c = http.client.HTTPConnection("127.0.0.1", 18180, timeout=timeout)
        c.request("GET", path)
        r = c.getresponse()
        h, n = hashlib.sha256(), 0
        try:
            while True:
                b = r.read(1 << 20)
                if not b:
                    break
                h.update(b); n += len(b)
        except Exception:
            pass
        status, length = r.status, int(r.getheader("Content-Length") or -1)
        c.close()
        whole = n == length
        right = (not whole) or status != 200 or h.hexdigest() == digest[path]
        return status, right, whole, time.monotonic() - t
    except Exception:
        return 0, True, False, time.monotonic() - t

def mix(x):
    x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & MASK
    x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & MASK
    return x ^ (x >> 31)

def place(path, ids, weights):
    """The disk (index into ids) a key goes to: cache::placement, as the server computes it."""
    key = b"\0\0" + path.lstrip("/").encode()
    h = 0xcbf29ce484222325
    for b in key:
        h = ((h ^ b) * 0x100000001b3) & MASK
    h = mix(h)
    best = None
    for i, (d, w) in enumerate(zip(ids, weights)):
        u = ((mix(h ^ mix(d)) >> 11) + 0.5) / float(1 << 53)
        s = -w / math.log(u)
        if best is None or s > best[0]:
            best = (s, i)
    return best[1]

def disk_ids(ds):
    return [int(open(f"{d}/disk-id").read(), 16) for d in ds]

def weights(ds):
    return [max(os.statvfs(d).f_blocks * os.statvfs(d).f_frsize, 1) for d in ds]

def files(d):
    try:
        return sorted(int(n, 16) for n in os.listdir(f"{d}/data"))
    except OSError:
        return []

def p99(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * 0.99))] if xs else float("nan")

report = ["# perf/DISKS.md: several cache disks under load (perf/disks.sh)", "",
          f"Host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, binary {BIN}. Disks: ext4 on "
          "loop devices over /dev/shm images (1 GiB each), 2 shards, nginx origin on "
          "loopback.", ""]
three = mounts[:3]

# Warm: the hot set, then a restart with every disk (the baseline for the missing-disk one).
start(three)
for i in range(HOT):
    r = get(f"/pull/hot/{i}")
    if r[0] != 200:
        raise SystemExit(f"hot {i}: {r}\n" + open(f"{WORK}/server.log").read()[-3000:])
ids, ws = disk_ids(three), weights(three)
predicted = [place(f"/pull/hot/{i}", ids, ws) for i in range(HOT)]
actual = {}
for slot, d in enumerate(three):
    for n in files(d):
        actual[n - 1] = slot
placement_right = sum(predicted[i] == actual.get(i) for i in range(HOT))
stop()

def restart_time(disks, objects):
    t0 = start(disks)
    for i in objects:
        s = get(f"/pull/hot/{i}")
        assert s[0] == 200 and s[1] and s[2], (i, s)
    return time.monotonic() - t0

all_disks_s = restart_time(three, range(HOT))

# Disk gone under load.
dead = max(range(3), key=lambda s: sum(1 for i in range(HOT) if actual.get(i) == s))
others = [i for i in range(HOT) if actual.get(i) != dead]
on_dead = [i for i in range(HOT) if actual.get(i) == dead]
events = []          # (when, kind, status, right, whole, seconds)
lock = threading.Lock()
stop_load = threading.Event()
cold_next = [0]

def hits(set_):
    k = 0
    while not stop_load.is_set():
        i = set_[k % len(set_)]; k += 1
        r = get(f"/pull/hot/{i}")
        with lock:
            events.append((time.monotonic(), "hit-other" if i in others else "hit-dead") + r)

def colds():
    while not stop_load.is_set():
        with lock:
            i = cold_next[0]; cold_next[0] += 1
        if i >= 400:
            return
        r = get(f"/pull/cold/{i}")
        with lock:
            events.append((time.monotonic(), "cold") + r)

threads = [threading.Thread(target=hits, args=(others,)) for _ in range(2)]
threads += [threading.Thread(target=hits, args=(on_dead,))]
threads += [threading.Thread(target=colds) for _ in range(2)]
for t in threads:
    t.start()
time.sleep(4)
before_fetches = origin_fetches()
t_dead = time.monotonic()
sh("python3", "-c", "import fcntl, os, struct; fd = os.open(%r, os.O_RDONLY); "
   "fcntl.ioctl(fd, 0x8004587D, struct.pack('I', 2))" % three[dead])
time.sleep(6)
stop_load.set()
for t in threads:
    t.join()
after_fetches = origin_fetches()
refetched = [after_fetches.get(f"/pull/hot/{i}", 0) - before_fetches.get(f"/pull/hot/{i}", 0)
             for i in on_dead]
post = [e for e in events if e[0] >= t_dead]
wrong = sum(1 for e in events if not e[3])
cut = sum(1 for e in post if e[2] == 200 and not e[4])
errors = sum(1 for e in post if e[2] != 200)
failed_dead = sum(1 for e in post if e[1] == "hit-dead" and not (e[2] == 200 and e[4]))
hb = [e[5] for e in events if e[1] == "hit-other" and e[0] < t_dead]
ha = [e[5] for e in post if e[1] == "hit-other"]
report += ["## Disk gone (EXT4_IOC_SHUTDOWN mid-load)", "",
           f"Disk {dead} held {len(on_dead)} of the {HOT} hot objects (placement computed here "
           f"matched the server's for {placement_right} of {HOT}). Two clients hit the others' "
           "objects, one the dead disk's, two fetched cold 1 MiB objects, 4 s before and 6 s "
           "after the shutdown.", "",
           "| figure | target | measured |", "|---|---|---|",
           f"| wrong bytes (responses with a body that is not the origin's) | 0 | {wrong} |",
           f"| cut downloads after the shutdown (200, short body) | 0 | {cut} |",
           f"| other failed responses after it (5xx, no response) | - | {errors} |",
           f"| of them, reads of the dead disk's objects | - | {failed_dead} |",
           f"| origin fetches per dead-disk object after it | 1 | {sorted(refetched)} |",
           f"| hits on the other disks, p99 before / after (ms) | after <= 1.2x | "
           f"{p99(hb) * 1000:.1f} / {p99(ha) * 1000:.1f} ({p99(ha) / p99(hb):.2f}x) |",
           f"| responses in all (before / after) | - | {len(events) - len(post)} / {len(post)} |", ""]

# Disk stalled: a cold download of an object placed on a live disk; once its data file
# exists (the fill writes to it), the disk is frozen. Hits on the third disk's objects run
# before and throughout; `perf trace` (tracepoints: no ptrace stop per syscall, which would
# itself move the p99) counts the shard threads' syscalls while the disk is frozen.
live = [s for s in range(3) if s != dead]
frozen, steady = live
usable_ids = [ids[s] for s in live]
usable_ws = [ws[s] for s in live]
big = next(f"/pull/big/{i}" for i in range(1000)
           if live[place(f"/pull/big/{i}", usable_ids, usable_ws)] == frozen)
digest[big] = write_object(ORIGIN + big, STALL_BYTES)
# The same download placed on the steady disk, not frozen: the hits' baseline.
calm = next(f"/pull/calm/{i}" for i in range(1000)
            if live[place(f"/pull/calm/{i}", usable_ids, usable_ws)] == steady)
digest[calm] = write_object(ORIGIN + calm, STALL_BYTES)
t = time.monotonic()
c = http.client.HTTPConnection("127.0.0.1", 18181, timeout=60)
c.request("GET", big)
r = c.getresponse()
while r.read(1 << 20):
    pass
c.close()
origin_s = time.monotonic() - t
on_steady = [i for i in others if actual.get(i) == steady]
shard_tids = {}
for tid in os.listdir(f"/proc/{server.pid}/task"):
    comm = open(f"/proc/{server.pid}/task/{tid}/comm").read().strip()
    if comm.startswith("shard-"):
        shard_tids[int(tid)] = comm
stall_events = []
stop_hits = threading.Event()
def steady_hits():
    k = 0
    while not stop_hits.is_set():
        i = on_steady[k % len(on_steady)]; k += 1
        r = get(f"/pull/hot/{i}")
        with lock:
            stall_events.append((time.monotonic(),) + r)
hit_threads = [threading.Thread(target=steady_hits) for _ in range(2)]
for h in hit_threads:
    h.start()
time.sleep(1)
t_calm = time.monotonic()
calm_r = get(calm, timeout=120)
t_calm_end = time.monotonic()
time.sleep(1)
before_data = len(files(three[frozen]))
res = {}
def download():
    res["r"] = get(big, timeout=120)
t = threading.Thread(target=download)
t0 = time.monotonic()
t.start()
while len(files(three[frozen])) == before_data and time.monotonic() - t0 < 30:
    time.sleep(0.005)
sh("fsfreeze", "--freeze", three[frozen])
t_freeze = time.monotonic()
trace = subprocess.Popen(["perf", "trace", "-s", "-p", str(server.pid), "-o", f"{WORK}/trace.txt"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
t.join(125)
took = time.monotonic() - t0
time.sleep(1)
trace.send_signal(signal.SIGINT)
trace.wait(30)
stop_hits.set()
for h in hit_threads:
    h.join()
sh("fsfreeze", "--unfreeze", three[frozen])
status, right, whole, secs = res.get("r", (0, True, False, took))
# The shard threads' syscalls while frozen, by name (perf trace -s: a section per thread).
FILE_CALLS = {"open", "openat", "openat2", "pread64", "pwrite64", "preadv", "pwritev",
              "preadv2", "pwritev2", "fsync", "fdatasync", "sync_file_range", "fallocate",
              "ftruncate", "statx", "newfstatat", "fstat", "unlinkat", "renameat", "renameat2",
              "mkdirat", "truncate"}
seen = {}
current = None
try:
    for line in open(f"{WORK}/trace.txt"):
        head = line.strip().split(" ")
        if line.strip().endswith("events, ") or " events, " in line:
            tid = line.strip().split("(")[-1].split(")")[0]
            current = int(tid) if tid.isdigit() and int(tid) in shard_tids else None
            continue
        if current is not None and len(head) > 1 and head[0] and head[0].isidentifier():
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                seen[parts[0]] = seen.get(parts[0], 0) + int(parts[1])
except FileNotFoundError:
    pass
file_calls = {k: v for k, v in seen.items() if k in FILE_CALLS}
hb = [e[4] for e in stall_events if t_calm <= e[0] <= t_calm_end]
ha = [e[4] for e in stall_events if t_freeze <= e[0] <= t0 + took]
bad_hits = sum(1 for e in stall_events if not (e[1] == 200 and e[2] and e[3]))
log_text = open(f"{WORK}/server.log").read()
report += ["## Disk stalled (fsfreeze during a cold 192 MiB download placed on it)", "",
           f"The download started, and the disk was frozen once its data file existed "
           f"({t_freeze - t0:.2f} s in). `cache_disk_op_timeout_ms` is the default (5000). The "
           f"same object straight from the origin took {origin_s:.2f} s. Two clients hit the "
           f"{len(on_steady)} hot objects of the third disk throughout.", "",
           "| figure | target | measured |", "|---|---|---|",
           f"| the download completed, every byte right | yes | "
           f"{'yes' if status == 200 and whole and right else 'no'} (status {status}, "
           f"whole {whole}, right {right}) |",
           f"| its time (s) | <= 5 + origin time ({5 + origin_s:.1f}) | {secs:.1f} |",
           f"| shard threads' file syscalls while frozen (`perf trace -s`) | 0 | "
           f"{sum(file_calls.values())} {file_calls or ''} |",
           f"| hits on the third disk, p99 during the same download on it, not frozen ({t_calm_end - t_calm:.2f} s, "
           f"{'right' if calm_r[0] == 200 and calm_r[1] and calm_r[2] else 'WRONG'}) / during the "
           f"frozen one (ms) | <= 1.5x | "
           f"{p99(hb) * 1000:.1f} / {p99(ha) * 1000:.1f} ({p99(ha) / p99(hb):.2f}x) |",
           f"| hits that failed or were wrong | 0 | {bad_hits} of {len(stall_events)} |",
           f"| 'cache disk stalled' lines / fills given up | 1 / - | "
           f"{log_text.count('cache disk stalled')} / "
           f"{log_text.count('cache disk operation past its deadline')} |", "",
           "Every syscall the shard threads made while the disk was frozen, by name: "
           + (", ".join(f"{k} {v}" for k, v in sorted(seen.items())) or "(none traced)")
           + ". `read` and `write` there are the shards' eventfd wake-ups (a shard's file I/O "
           "is all on its ring).", ""]

def admin_metric(name, label):
    c = http.client.HTTPConnection("127.0.0.1", 18182, timeout=5)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith(name + "{") and label in l)

# The thawed disk comes back by itself once quiet (STALL_QUIET_S).
t_thaw = time.monotonic()
while admin_metric("shardline_cache_disk_stalled", f'disk="{frozen}"') != 0:
    if time.monotonic() - t_thaw > 90:
        shutil.copy(f"{WORK}/server.log", os.environ.get("DISKS_SERVER_LOG", "/tmp/disks-server.log"))
        c = http.client.HTTPConnection("127.0.0.1", 18182, timeout=5)
        c.request("GET", "/metrics")
        held = [l for l in c.getresponse().read().decode().splitlines() if "cache_disk" in l and not l.startswith("#") and "_bucket" not in l]
        raise SystemExit("the thawed disk never came back\n" + "\n".join(held))
    time.sleep(0.5)
back_s = time.monotonic() - t_thaw
report += [f"After the thaw the disk came back online by itself in {back_s:.1f} s "
           "(`STALL_QUIET_S` is 30: every held operation back, then 30 s quiet).", ""]

# Disk back: the dead drive swapped for a blank one, brought online while serving. The hot
# objects are fetched once first (those of the frozen disk left the index when it stalled).
for i in others:
    get(f"/pull/hot/{i}")
replace_disk(dead)
before_files = [len(files(d)) for d in three]
before = origin_fetches()
said = sh(BIN, "cache", "disk", "online", str(dead), "--admin", "127.0.0.1:18182",
          "--token-file", TOKEN)
for i in others:
    get(f"/pull/hot/{i}")
after = origin_fetches()
moved = sum(after.get(f"/pull/hot/{i}", 0) - before.get(f"/pull/hot/{i}", 0) for i in others)
for i in range(BACK):
    s = get(f"/pull/back/{i}")
    assert s[0] == 200 and s[1] and s[2], (i, s)
got = [len(files(d)) - b for d, b in zip(three, before_files)]
share_new = got[dead] / max(sum(got), 1)
want_new = ws[dead] / sum(ws)
report += ["## Disk back (the dead drive swapped for a blank one, online while serving)", "",
           f"`shardline cache disk online {dead}` said: {said}", "",
           "| figure | target | measured |", "|---|---|---|",
           f"| the replacement's share of {BACK} new objects / its weight | within 10 % | "
           f"{share_new:.3f} / {want_new:.3f} ({abs(share_new - want_new) / want_new * 100:.1f} % off) |",
           f"| objects of the other disks fetched again after it came | 0 | {moved} |",
           f"| new objects per disk (slot: count) | - | "
           f"{', '.join(f'{s}: {got[s]}' for s in range(3))} |", ""]
stop()

# Restart with a disk missing (its directory gone: left out).
gone = [d if s != dead else f"{WORK}/gone" for s, d in enumerate(three)]
missing_s = restart_time(gone, others)
log = open(f"{WORK}/server.log").read()
report += ["## Restart with a disk missing", "",
           "| figure | target | measured |", "|---|---|---|",
           f"| time until every hot object of the others is served (s): all disks / one "
           f"missing | same | {all_disks_s:.2f} / {missing_s:.2f} |",
           f"| warning lines naming a left-out disk | 1 | {log.count('cache disk left out')} |", ""]
stop()
shutil.copy(f"{WORK}/server.log", os.environ.get("DISKS_SERVER_LOG", "/tmp/disks-server.log"))
cleanup()
open(OUT, "w").write("\n".join(report))
print("\n".join(report))
PYEOF
log "work dir $WORK; the driver runs (a few minutes)"
python3 "$WORK/driver.py" run "$WORK" "$BIN" "$OUT"
log "wrote $OUT"
