from mlperf import corpus


def test_split_is_disjoint_and_follows_the_path_rule():
    train, heldout = corpus.split()
    assert len(train) > 500 and len(heldout) > 10
    assert not set(train) & set(heldout)
    assert all(corpus.is_heldout(f) for f in heldout) and not any(corpus.is_heldout(f) for f in train)
    assert not any(part in corpus.EXCLUDED_PARTS for f in train + heldout for part in f.split("/")[:-1])


def test_load_bytes_concatenates_with_the_separator(tmp_path):
    (tmp_path / "a.py").write_bytes(b"x = 1\n")
    (tmp_path / "b.py").write_bytes(b"y = 2\n")
    assert corpus.load_bytes(["a.py", "b.py"], tmp_path).tobytes() == b"x = 1\n" + corpus.SEPARATOR + b"y = 2\n"
