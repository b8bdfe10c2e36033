"""pgprobe's benchmark (`scripts/bench`): overhead on a traced server, time to first data,
finish time, memory, render and symbolize throughput. Independent of pytest.

Run it as root from the top of the checkout: `scripts/bench` (or `.venv/bin/python -m bench`).
Modules: `overhead` (pgbench rounds with and without a tool), `render` (folded stacks to SVG),
`symbolize` (100,000 raw stacks), `runtool` (runs pgprobe and reports its own peak memory),
`report` (docs/benchmarks.md and the budgets), `common` (/proc readings, statistics).
"""
