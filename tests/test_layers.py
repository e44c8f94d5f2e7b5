"""The packages stand on floors, and every import points down: a package imports only those below it (imports
inside functions included), and no module imports itself back through others.

FLOORS is the order. The one import allowed to run up is `python -m mlperf`'s entry point, which starts the
command line on the top floor; KNOWN would list, module by module, imports that still run up while a move is
under way. The test fails on any other, and on a listed one that is gone, so that the list only shrinks."""
import ast

from tests.helpers import ROOT

FLOORS = ["mlperf", "suts.fast", "suts.engine", "suts", "scenarios", "serving", "roofline", "reports", "training",
          "commands", "labs"]
PACKAGES = sorted({floor.split(".")[0] for floor in FLOORS})  # suts.fast and suts.engine are floors inside suts
ENTRY_POINTS = {"mlperf.__main__": {"commands"}}  # `python -m mlperf` starts the command line; nothing imports it
KNOWN = {}  # module -> the packages above it that it still imports, while a move is under way


def imports() -> dict[str, set[str]]:
    """Each module of the floors' packages and the modules of those packages it imports."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            names = set()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names |= {a.name for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            found[module] = {n for n in names if n.split(".")[0] in PACKAGES}
    return found


def floor(name: str) -> int:
    """A module's floor: that of the longest floor its name falls under (suts.fast.runner: suts.fast's)."""
    under = [f for f in FLOORS if name == f or name.startswith(f + ".")]
    return FLOORS.index(max(under, key=len))


def floor_name(name: str) -> str:
    return FLOORS[floor(name)]


def test_every_import_points_down_a_floor():
    up = {}
    for module, names in imports().items():
        above = {floor_name(n) for n in names if floor(n) > floor(module)}
        if above:
            up[module] = above
    assert up == {**ENTRY_POINTS, **KNOWN}


def test_the_fast_path_and_the_engine_are_floors_below_the_strategies():
    """suts.fast and suts.engine import no strategy of suts (a scheduler that reached for suts.base, or a runner for
    suts.engine.sampling, would run up a floor)."""
    assert floor_name("suts.fast.runner") == "suts.fast" and floor_name("suts.engine.sampling") == "suts.engine"
    assert floor("suts.speculative") > floor("suts.engine.scheduler") > floor("suts.fast.runner")
    assert floor("suts.fast.runner") > floor("mlperf.model")


def test_no_module_imports_itself_back():
    graph = imports()
    modules = set(graph)
    edges = {m: {n if n in modules else n.rsplit(".", 1)[0] for n in names} & modules - {m}
             for m, names in graph.items()}

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            m = todo.pop()
            if m == goal:
                return True
            if m not in seen:
                seen.add(m)
                todo += edges[m]
        return False
    circles = sorted(f"{m} <-> {n}" for m in edges for n in edges[m] if m < n and reaches(n, m))
    assert not circles


def test_no_stand_in_objects_in_the_package_code():
    """A SUT that runs elsewhere says what LoadGen's adapter needs of it (`vocab_size`, ...) as a SUT in process
    does, rather than posing as one with a SimpleNamespace in place of its target."""
    found = [str(path.relative_to(ROOT)) for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
             if "SimpleNamespace" in path.read_text()]
    assert found == []


def test_serving_asks_nothing_of_a_run_it_serves():
    """serving/ builds on the scenarios' types (a RunConfig, a Host, SUTInfo), never on how a LoadGen run goes."""
    reached = {module: sorted(n for n in names if n.startswith("scenarios.run"))
               for module, names in imports().items() if module.startswith("serving")}
    assert {module: names for module, names in reached.items() if names} == {}
