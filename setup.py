from setuptools import setup

setup(
    name="mlperf-spec",
    version="0.1.0",
    description="MLPerf-style LoadGen harness for LLM decoding strategies, with a roofline module",
    python_requires=">=3.10",
    packages=["mlperf", "suts", "suts.fast", "suts.engine", "scenarios", "serving", "roofline", "reports", "training",
              "commands", "labs"],
    package_data={"mlperf": ["assets/*.jsonl", "assets/*.md", "assets/models/*/*"], "scenarios": ["conf/*.conf"],
                  "suts.fast": ["kernels/*"]},
    # torch is pinned by the Makefile (torch==2.13.0, a CPU build on CPU machines) before this installs.
    # scipy: the exactness tests of sampling SUTs, and lab 2's grader. pydantic: the server's request bodies
    # (serving/protocol.py).
    install_requires=["torch>=2.4", "mlcommons-loadgen>=6.0", "numpy", "pandas", "matplotlib", "safetensors",
                      "tokenizers", "tqdm", "scipy", "pydantic>=2.5"],
    # Ray serves --replicas; a run with --replicas installs it on first use (serving/replicas.py reads it here).
    # PyYAML: MLCommons' submission checker imports it (make check-submission).
    # aiohttp and prometheus-client serve our engine (`serve`) and drive any server (`--endpoint`), installed on
    # first use (mlperf/extras.py pins the same versions); openai: the tests stream from our server with its client.
    # ruff: the house rules of the code's shape (tests/test_style.py, ruff.toml). playwright: drives Debian's Chromium
    # through the report page (tests/reports/test_page_in_browser.py); it downloads no browser of its own. Triton,
    # which runs the GPU's kernels on a CPU under its interpreter, is CI's (.ci/run): imported beside transformers it
    # prints nanobind's leak report at every exit, so the test extras leave it out and its tests skip without it.
    extras_require={"ray": ["ray==2.60.0"], "submission": ["pyyaml"],
                    "serve": ["aiohttp==3.14.5", "prometheus-client==0.26.0"],
                    "test": ["pytest", "pytest-xdist", "transformers", "ray==2.60.0", "pyyaml", "aiohttp==3.14.5",
                             "prometheus-client==0.26.0", "openai", "ruff==0.17.6",
                             "playwright==1.65.2"]},
)
