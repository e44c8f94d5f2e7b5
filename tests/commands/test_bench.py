from commands import bench


def test_bench_reports_greedy_and_sampled_settings_with_acceptance_spread(tiny_pair, tmp_path):
    target, draft = str(tiny_pair / "target"), str(tiny_pair / "draft")
    for setting, params in bench.SETTINGS.items():
        df = bench.run(target, draft, n_prompts=3, max_new_tokens=8, suts=("baseline", "spec"), reference_rows=False,
                       params=params, peaks_cache=tmp_path / "peaks.json")
        assert list(df.index) == ["baseline", "spec"] and (df["tokens"] == 24).all()
        assert df.loc["spec", "identical"] == (True if setting == "greedy" else None)
        low, mid, high = map(float, df.loc["spec", "per-prompt acc. min/med/max"].split("/"))
        assert 0 <= low <= mid <= high <= 1
        assert df.attrs["repetitive"] == [] or set(df.attrs["repetitive"]) <= {0, 1, 2}
    assert (tmp_path / "peaks.json").is_file()  # the peaks it measured cached where it was told, not in ./results


def test_sampled_setting_is_seeded_per_prompt(tiny_pair, tmp_path):
    target, draft = str(tiny_pair / "target"), str(tiny_pair / "draft")
    sampled = bench.SETTINGS["sampled"]
    runs = [bench.run(target, draft, 2, 8, suts=("spec",), reference_rows=False, params=sampled,
                      peaks_cache=tmp_path / "peaks.json") for _ in range(2)]
    assert runs[0].loc["spec", "per-prompt acc. min/med/max"] == runs[1].loc["spec", "per-prompt acc. min/med/max"]


def test_a_tree_shape_reaches_the_tree_suts_only(tiny_pair, monkeypatch, tmp_path):
    """--tree goes to every -tree SUT (its depth becomes its gamma) and to no chain SUT, which would refuse it."""
    target, draft = str(tiny_pair / "target"), str(tiny_pair / "draft")
    built = {}
    build = bench.build_sut
    monkeypatch.setattr(bench, "build_sut", lambda name, *a, **k: built.setdefault(name, build(name, *a, **k)))
    df = bench.run(target, draft, 2, 8, suts=("baseline", "spec", "spec-tree"), reference_rows=False, tree="2,2",
                   peaks_cache=tmp_path / "peaks.json")
    assert built["spec-tree"].fanout == (2, 2) and built["spec"].fanout == () and df["identical"].all()
