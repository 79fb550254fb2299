"""What benchmarks and tests both start and drive: a real service in processes
(`pipeline_harness`), private Redis/PostgreSQL, fault-injecting proxies, the fault and
partition campaigns, a private Slurm cluster, a browser. Tests import it; so do the benches,
which import no test module."""
