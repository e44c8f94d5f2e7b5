import pytest

from mlperf import corpus
from mlperf.data import (CONTINUATION, MAX_BYTES, MAX_PER_FILE, MIN_BYTES, DatasetError, build_prompts, load_prompts,
                         trivially_predictable)


@pytest.fixture(scope="module")
def prompts():
    return load_prompts()


def test_shipped_prompts_are_varied_excerpts(prompts):
    assert len(prompts) >= 200 and [p.id for p in prompts] == list(range(len(prompts)))
    lengths = [len(p.text.encode()) for p in prompts]
    assert MIN_BYTES <= min(lengths) and max(lengths) <= MAX_BYTES and max(lengths) - min(lengths) > 200
    assert len({p.source for p in prompts}) >= 10
    assert max(sum(p.source == q.source for q in prompts) for p in prompts) <= MAX_PER_FILE


def test_no_prompt_overlaps_the_training_files(prompts):
    train, _ = corpus.split()
    train_text = corpus.load_bytes(train).tobytes()
    root = corpus.stdlib_root()
    for p in prompts:
        assert corpus.is_heldout(p.source), p.source
        excerpt = p.text.encode()
        assert excerpt not in train_text, f"prompt {p.id} occurs in the training files"
        source = root / p.source
        if source.is_file():  # the shipped excerpts were cut from this very file (same Python version)
            data, end = source.read_bytes(), p.offset + len(excerpt)
            assert data[p.offset:end] == excerpt
            assert len(data) - end >= CONTINUATION, f"prompt {p.id} is cut at the end of its file"
            assert not trivially_predictable(data[p.offset:end + CONTINUATION]), f"prompt {p.id} is repetitive text"


def test_trivially_predictable_tells_tables_from_code():
    code = (corpus.stdlib_root() / "difflib.py").read_bytes()[20000:20400]
    table = b"".join(b"    'alias%d': 'en_US.ISO8859-1',\n" % i for i in range(12))
    assert not trivially_predictable(code) and trivially_predictable(table)


def test_the_generator_reproduces_the_shipped_file(prompts):
    root = corpus.stdlib_root()
    if not all((root / p.source).is_file() and p.text.encode() in (root / p.source).read_bytes() for p in prompts):
        pytest.skip("the prompts were cut from another Python version's standard library")
    assert build_prompts() == prompts


def test_bad_prompt_files(tmp_path):
    with pytest.raises(DatasetError, match="not found"):
        load_prompts(tmp_path / "none.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"id": 0, "source": "a.py", "offset": 0, "text": "x"}\n{"id": 1}\n')
    with pytest.raises(DatasetError, match="bad.jsonl:2: bad prompt record"):
        load_prompts(tmp_path / "bad.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DatasetError, match="no prompts"):
        load_prompts(tmp_path / "empty.jsonl")
    for text, kind in [("null", "NoneType"), ('["a"]', "list")]:  # never run as the text "None"
        (tmp_path / "typed.jsonl").write_text('{"id": 0, "source": "a.py", "offset": 0, "text": ' + text + '}\n')
        with pytest.raises(DatasetError,
                           match=f"typed.jsonl:1: bad prompt record \\(text must be a string, got {kind}"):
            load_prompts(tmp_path / "typed.jsonl")
    latin1 = '{"id": 0, "source": "a.py", "offset": 0, "text": "caf\xe9"}\n'.encode("latin-1")
    (tmp_path / "latin1.jsonl").write_bytes(latin1)
    with pytest.raises(ValueError, match="latin1.jsonl: not UTF-8 text"):
        load_prompts(tmp_path / "latin1.jsonl")


def test_repetitive_tail_spots_degenerate_runs_only():
    from mlperf.data import repetitive_tail
    code = "def f(x):\n    return x + 1\n\n\nclass Spam:\n    def eggs(self):\n        return 42\n"
    assert not repetitive_tail(code)
    assert repetitive_tail(code + " " * 48)
    assert repetitive_tail(code + "\n    \n" * 12)
    assert repetitive_tail(code + "the string " * 6)
    assert not repetitive_tail("the string " * 3)  # shorter than the span
    assert not repetitive_tail(code + "x = 1\ny = 2\n" * 2 + "z = 3\n" * 2 + "done()\n")
