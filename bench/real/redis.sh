# redis-server on loopback, driven by redis-benchmark (SET, GET, LPUSH, LPOP, HSET, 100-byte
# values over 100,000 random keys, 20 clients). Only the server runs under the allocator being
# measured; the client runs on the system allocator. Debian's redis-server is linked with
# libjemalloc and calls plain malloc, so without a preload it runs on jemalloc, and a preloaded
# allocator replaces jemalloc. SCALE: units of 5,000 requests per command.
source "$(dirname "$0")/common.sh"
case "$verb" in
  check) need redis-server redis-server; need redis-benchmark redis-tools; need redis-cli redis-tools ;;
  setup) ;;
  run) port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
       redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --daemonize no \
         --logfile "$dir/redis.log" &
       server=$!
       trap 'kill $server 2>/dev/null || true' EXIT
       for _ in $(seq 200); do env -u LD_PRELOAD redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
       env -u LD_PRELOAD redis-benchmark -p "$port" -q -n $((5000 * scale)) -c 20 -d 100 -r 100000 \
         -t set,get,lpush,lpop,hset >&2
       env -u LD_PRELOAD redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
       wait "$server" || true
       trap - EXIT ;;
esac
