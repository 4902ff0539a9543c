-- wrk script for perf/bench.sh: print the run's totals as key=value lines (parsed by bench.sh)
-- instead of wrk's rounded "Transfer/sec" text.
done = function(summary, latency, requests)
  io.write(string.format("wrk_requests=%d\n", summary.requests))
  io.write(string.format("wrk_bytes=%d\n", summary.bytes))
  io.write(string.format("wrk_duration_us=%d\n", summary.duration))
  io.write(string.format("wrk_err_connect=%d\n", summary.errors.connect))
  io.write(string.format("wrk_err_read=%d\n", summary.errors.read))
  io.write(string.format("wrk_err_write=%d\n", summary.errors.write))
  io.write(string.format("wrk_err_status=%d\n", summary.errors.status))
  io.write(string.format("wrk_err_timeout=%d\n", summary.errors.timeout))
  io.write(string.format("wrk_latency_p50_us=%d\n", latency:percentile(50)))
  io.write(string.format("wrk_latency_p99_us=%d\n", latency:percentile(99)))
end
