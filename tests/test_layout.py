"""What this proves: the code keeps the shape a newcomer can walk: the r3 import graph has no cycles, the toy tasks
import nothing from r3 but its error types (no engine in the task file), library files stay under 400 lines and no
function in r3/ or the two scripts is over 60 lines."""
import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def r3_imports(path: str) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("r3."):
            out.add(node.module[3:])
        elif isinstance(node, ast.Import):
            out |= {a.name[3:] for a in node.names if a.name.startswith("r3.")}
    return out


def r3_files() -> list[str]:
    return sorted(glob.glob(os.path.join(ROOT, "r3", "**", "*.py"), recursive=True))


def module_name(path: str) -> str:
    """r3/model/moe.py -> model.moe, as r3_imports names it (a package's __init__.py: the package)."""
    rel = os.path.relpath(path, os.path.join(ROOT, "r3"))[:-3].replace(os.sep, ".")
    return rel.removesuffix(".__init__").removesuffix("__init__")


def test_import_graph_has_no_cycles_and_tasks_sit_at_the_bottom():
    graph = {module_name(f): r3_imports(f) for f in r3_files()}
    assert graph["errors"] == set()  # the error types sit below everything
    assert graph["tasks.tasks"] <= {"errors"} and graph["model.moe"] <= {"errors"}
    done, active = set(), []

    def visit(m):
        assert m not in active, f"import cycle: {' -> '.join(active[active.index(m):] + [m])}"
        if m in done:
            return
        active.append(m)
        for d in graph.get(m, ()):
            visit(d)
        active.pop()
        done.add(m)
    for m in graph:
        visit(m)


def test_files_and_functions_stay_short():
    for f in r3_files() + [os.path.join(ROOT, x) for x in ("train.py", "rollout.py")]:
        src = open(f).read()
        if "/r3/" in f:
            assert src.count("\n") < 400, f"{f}: {src.count(chr(10))} lines"
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                assert n <= 60, f"{f}:{node.lineno} {node.name} is {n} lines"
