"""The commands that make a series of runs, each in a child process: sweep, pareto, scale, qps-sweep."""
from dataclasses import replace

from commands.options import add_run_options, add_several, listed, run_config

SWEEP_OPTIONS = ("target", "draft", "device", "dtype", "results", "user_conf", "gamma", "max_new_tokens", "threads")


def cmd_sweep(args):
    """Every SUT through LoadGen Offline at a rising max batch: tokens/s, speedups, where spec stops paying."""
    from commands.sweep import BATCHES, CHECK_ROUNDS, FIT_ROUNDS, SUTS, explain_again, sweep
    if args.explain:
        explain_again(args.explain)
        return
    batches = listed(args.batches, int, "--batches", BATCHES)
    rounds = FIT_ROUNDS if args.fit_rounds is None else args.fit_rounds
    checks = CHECK_ROUNDS if args.check_rounds is None else args.check_rounds
    cfg, suts = series(args, SUTS)
    print(f"results: {sweep(cfg, suts, batches, args.samples, rounds, checks)}")


def series(args, default: tuple) -> tuple:
    """A series' settings and SUTs: with --endpoint, the server under the one --sut other than the baseline (default
    `http`), against the baseline in process."""
    cfg, suts = run_config(args), tuple(args.suts or default)
    if not cfg.endpoint:
        return cfg, suts
    named = [s for s in args.suts or ("http",) if s != "baseline"]
    return replace(cfg, sut=named[0] if named else ""), ("baseline", *named)


def cmd_pareto(args):
    """Every SUT through LoadGen Offline at a rising concurrency: per-user against total tokens/s (Pareto curves)."""
    from commands.pareto import CONCURRENCY, SUTS, pareto
    concurrency = listed(args.concurrency, int, "--concurrency", CONCURRENCY)
    cfg, suts = series(args, SUTS)
    print(f"results: {pareto(cfg, suts, concurrency, args.samples)}")


def cmd_scale(args):
    """Offline tokens/s on 1, 2, 4 ... Ray replicas beside one process on the same cores: scaling efficiency."""
    from commands.scale import COUNTS, scale
    counts = listed(args.counts, int, "--replica-counts", COUNTS)
    print(f"results: {scale(run_config(args), counts, args.samples)}")


def cmd_qps_sweep(args):
    """Every SUT through LoadGen Server at a range of loads: p99 TTFT, p99 TPOT and goodput against QPS."""
    from commands.qps import LOADS, SUTS, qps_sweep
    loads = listed(args.loads, float, "--loads", LOADS)
    cfg = run_config(args)
    suts = tuple(args.suts or ((cfg.sut,) if cfg.endpoint else SUTS))  # a server: its one label
    print(f"results: {qps_sweep(cfg, suts, loads)}")


def cmd_engines(args):
    """Serving engines side by side under the same LoadGen tests: spec in process, behind our server, and
    llama.cpp's llama-server plain and speculative, on the same weights, prompts and cores."""
    from commands.engines import ENGINES, engines
    print(f"results: {engines(run_config(args), tuple(args.engines or ENGINES), peak=args.peak)}")


def cmd_soak(args):
    """Our server under a long mixed load: good, malformed and disconnecting requests; answers and memory checked."""
    from commands import soak
    soak.main(args)


def add_series_commands(command) -> None:
    """The commands that make a series of runs, each in a child process: sweep, pareto, scale, qps-sweep."""
    from commands import pareto, qps, sweep
    sw = command("sweep", cmd_sweep)
    add_several(sw, "sut", sweep.SUTS)
    sw.add_argument("--batches", help="comma-separated max batches, rising from 1 (default 1,2,4,8,16,32,64)")
    sw.add_argument("--fit-rounds", dest="fit_rounds", type=int, help="runs of batch 1 and of batch 2, which the "
                    "prediction is fitted on, spread over the sweep (default 3)")
    sw.add_argument("--check-rounds", dest="check_rounds", type=int, help="runs of every other batch, which the "
                    "prediction is checked against (their mean), spread over the sweep (default 1)")
    sw.add_argument("--explain", metavar="SWEEP_DIR",
                    help="write a finished sweep's table and plot again from its runs")
    add_run_options(sw, SWEEP_OPTIONS + ("samples", "replicas", "ray_address", "endpoint", "model"),
                    defaults={"samples": 64})

    pa = command("pareto", cmd_pareto)
    add_several(pa, "sut", pareto.SUTS)
    pa.add_argument("--concurrency", help="comma-separated queries in flight, rising, at least 7 (default "
                                          "1,2,3,4,6,8,12,16)")
    add_run_options(pa, SWEEP_OPTIONS + ("samples", "endpoint", "model"), defaults={"samples": 32})

    sc = command("scale", cmd_scale)
    sc.add_argument("--replica-counts", dest="counts", help="comma-separated replica counts, rising from 1 "
                                                            "(default 1,2)")
    add_run_options(sc, SWEEP_OPTIONS + ("sut", "samples", "max_batch", "ray_address"), defaults={"samples": 128})

    en = command("engines", cmd_engines)
    en.add_argument("--setup", dest="engines", action="append",
                    help="an engine setup to include: 'in process', 'our server', 'llama-server' or 'llama-server "
                         "spec' (repeatable; default all; --engine is a run's peer engine to start)")
    en.add_argument("--no-peak", dest="peak", action="store_false", help="leave out the Server peak search")
    add_run_options(en, SWEEP_OPTIONS + ("profile", "max_batch", "samples", "weights", "stall_timeout_s"),
                    defaults={"samples": 64})

    so = command("soak", cmd_soak)
    so.add_argument("--requests", type=int, default=1000)
    so.add_argument("--seconds", type=float, default=600.0, help="paced over this long (default 600)")
    so.add_argument("--bad", type=float, default=0.1, help="the share malformed or disconnecting (default 0.1)")
    add_run_options(so, ("sut", "max_new_tokens", "max_batch"), defaults={"max_new_tokens": 64, "max_batch": 8})

    qs = command("qps-sweep", cmd_qps_sweep)
    add_several(qs, "sut", qps.SUTS)
    qs.add_argument("--loads", help="comma-separated Server loads in QPS, rising (default 0.25,0.5,1,2)")
    add_run_options(qs, SWEEP_OPTIONS + ("profile", "head", "max_batch", "token_budget", "endpoint", "model", "engine"))
