# perf/fill-lib.sh: the pull-through cache benchmarks' shared setup (sourced by
# perf/fill-engine.sh and perf/fill.sh after perf/lib.sh): nginx as the origin serving
# $WORK/origin, a relay in front of it that holds every response's first byte for
# $DELAY_MS ms (the origin's distance: tc here has no netem), and nginx proxy_cache set up
# as lancache sets it up (slice 1m, proxy_cache_lock on) with its cache in $MNT/lancache.
# Expects WORK, MNT, DELAY_MS and the PIDS array; sets ORIGIN_PORT, RELAY_PORT, LANCACHE_PORT.

# fill_origin_body_bytes: body bytes the origin nginx has sent (one log line per request).
fill_origin_body_bytes() {
  awk '{ s += $1 } END { printf "%.0f", s }' "$WORK/nginx-origin/access.log" 2>/dev/null || echo 0
}

fill_setup() {
mkdir -p "$WORK/nginx-origin" "$WORK/lancache"
ORIGIN_PORT=18081 RELAY_PORT=18082 LANCACHE_PORT=18083
cat >"$WORK/nginx-origin/nginx.conf" <<EOF
daemon off; master_process off; worker_processes 1; pid $WORK/nginx-origin/pid;
error_log $WORK/nginx-origin/error.log;
events { worker_connections 1024; }
http { log_format sent '\$body_bytes_sent'; access_log $WORK/nginx-origin/access.log sent;
  sendfile on; keepalive_requests 100000;
  client_body_temp_path $WORK/nginx-origin; proxy_temp_path $WORK/nginx-origin;
  fastcgi_temp_path $WORK/nginx-origin; uwsgi_temp_path $WORK/nginx-origin; scgi_temp_path $WORK/nginx-origin;
  server { listen 127.0.0.1:$ORIGIN_PORT; root $WORK/origin; location / { } } }
EOF
nginx -p "$WORK/nginx-origin" -c "$WORK/nginx-origin/nginx.conf" &
PIDS+=($!)
wait_port "$ORIGIN_PORT" "${PIDS[-1]}" 10 || die "the origin did not start"

# The relay: holds the first byte of every response for DELAY_MS (the origin's distance),
# then copies both ways. One thread per connection; both servers go through it.
cat >"$WORK/relay.py" <<'EOF'
import socket, sys, threading, time
listen, target, delay = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) / 1000.0
def handle(c):
    o = socket.create_connection(("127.0.0.1", target))
    for s in (c, o):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    state = {"req": 0}
    def up():
        try:
            while True:
                b = c.recv(65536)
                if not b: break
                state["req"] += 1
                o.sendall(b)
        except OSError: pass
        finally:
            try: o.shutdown(socket.SHUT_WR)
            except OSError: pass
    def down():
        seen = 0
        try:
            while True:
                b = o.recv(1 << 20)
                if not b: break
                if state["req"] > seen:
                    seen = state["req"]
                    time.sleep(delay)
                c.sendall(b)
        except OSError: pass
        finally:
            try: c.shutdown(socket.SHUT_WR)
            except OSError: pass
    threading.Thread(target=up, daemon=True).start()
    threading.Thread(target=down, daemon=True).start()
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", listen)); l.listen(256)
while True:
    c, _ = l.accept()
    threading.Thread(target=handle, args=(c,), daemon=True).start()
EOF
python3 "$WORK/relay.py" "$RELAY_PORT" "$ORIGIN_PORT" "$DELAY_MS" &
PIDS+=($!)
wait_port "$RELAY_PORT" "${PIDS[-1]}" 10 || die "the relay did not start"

# lancache's setup (lancachenet/monolithic: slice 1m, proxy_cache_lock on, keys by slice).
mkdir -p "$MNT/lancache"
cat >"$WORK/lancache/nginx.conf" <<EOF
daemon off; master_process ${LANCACHE_MASTER:-off}; worker_processes ${LANCACHE_WORKERS:-1}; pid $WORK/lancache/pid;
error_log $WORK/lancache/error.log;
events { worker_connections 1024; }
http { access_log off; sendfile on;
  client_body_temp_path $WORK/lancache; proxy_temp_path $MNT/lancache-tmp;
  fastcgi_temp_path $WORK/lancache; uwsgi_temp_path $WORK/lancache; scgi_temp_path $WORK/lancache;
  proxy_cache_path $MNT/lancache levels=2:2 keys_zone=generic:64m inactive=200d max_size=${LANCACHE_MAX_SIZE:-100g} use_temp_path=off;
  server { listen 127.0.0.1:$LANCACHE_PORT;
    location / {
      slice 1m;
      proxy_cache generic;
      proxy_cache_key \$uri\$slice_range;
      proxy_set_header Range \$slice_range;
      proxy_cache_valid 200 206 3650d;
      proxy_cache_lock on; proxy_cache_lock_age 2m; proxy_cache_lock_timeout 1h;
      proxy_ignore_headers Expires Cache-Control;
      proxy_set_header Host origin;
      proxy_pass http://127.0.0.1:${LANCACHE_UPSTREAM_PORT:-$RELAY_PORT};
    } } }
EOF
mkdir -p "$MNT/lancache-tmp"
nginx -p "$WORK/lancache" -c "$WORK/lancache/nginx.conf" &
PIDS+=($!)
wait_port "$LANCACHE_PORT" "${PIDS[-1]}" 10 || die "lancache-style nginx did not start"
}
