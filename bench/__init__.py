"""pgprobe's benchmark (`scripts/bench --full`, `--quick`): everything the open issues ask to
be measured, in one run. Independent of pytest.

Run it as root from the top of the checkout. Modules: `configs` (workloads, ways of tracing,
the full profile), `plan` (window length and time box), `overhead` (pgbench rounds with and
without a tool), `bpfstats` (kernel BPF run-time statistics per program), `probe_cost` (the
mechanism's ns per fire), `hooks` (time to answer, `pgprobe serve`: other modules'
measure()), `render`, `symbolize`, `runtool` (runs pgprobe and reports its own peak memory),
`results` (the run as docs/benchmarks.json, budgets judged), `report` (docs/benchmarks.md
and docs/overhead.md's Overhead table from that JSON), `stats` (confidence intervals), `common`
(/proc readings, machine facts).
"""
