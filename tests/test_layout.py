"""What this proves: the code keeps the shape a newcomer can walk. r3/ is its wings and nothing loose but __init__.py,
the error types and four command entry points that hold no code; imports run one way between the wings, bottom to
top in the order r3/__init__.py declares (a file that imports a higher wing is named with the import); the r3
import graph has no cycles, the toy tasks import nothing from r3 but its error types (no engine in the task file),
library files stay under 400 lines and no function in r3/ or the two scripts is over 60 lines. experiments/ is one
package per study, each runnable as `python -m experiments.STUDY`, none importing another study, the shared modules
at the top importing no study (but the registry, which gathers each study's declared entries), no import circle, no
sys.path edits (nor in tests/), and no study file over 400 lines."""
import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WINGS = ("model", "runs", "scale", "tasks", "rollout", "train", "tools")  # bottom to top, as r3/__init__.py says
ENTRY_POINTS = ("check", "inspect", "plots", "serve")  # r3/NAME.py: `python -m r3.NAME`, no code
STUDIES = ("collapse", "staleness", "length", "mismatch", "speed", "regime", "servers")


def r3_imports(path: str) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("r3."):
            out.add(node.module[3:])
        elif isinstance(node, ast.Import):
            out |= {a.name[3:] for a in node.names if a.name.startswith("r3.")}
    return out


def imports(path: str, package: str) -> list[tuple[int, str]]:
    """(line, module) of every import of `package` in a file, at any depth (imports inside functions too);
    `from package.x import y` names package.x.y when that is a module, else package.x."""
    out = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                (node.module == package or node.module.startswith(package + ".")):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                is_module = os.path.exists(os.path.join(ROOT, *sub.split("."))) or \
                    os.path.exists(os.path.join(ROOT, *sub.split(".")) + ".py")
                out.append((node.lineno, sub if is_module else node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name == package or a.name.startswith(package + ".")]
    return out


def r3_files() -> list[str]:
    return sorted(glob.glob(os.path.join(ROOT, "r3", "**", "*.py"), recursive=True))


def module_name(path: str) -> str:
    """r3/model/moe.py -> model.moe, as r3_imports names it (a package's __init__.py: the package)."""
    rel = os.path.relpath(path, os.path.join(ROOT, "r3"))[:-3].replace(os.sep, ".")
    return rel.removesuffix(".__init__").removesuffix("__init__")


def no_cycles(graph: dict[str, set[str]]) -> None:
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


def test_import_graph_has_no_cycles_and_tasks_sit_at_the_bottom():
    graph = {module_name(f): r3_imports(f) for f in r3_files()}
    assert graph["errors"] == set()  # the error types sit below everything
    assert graph["tasks.tasks"] <= {"errors"} and graph["model.moe"] <= {"errors"}
    no_cycles(graph)


def test_r3_is_its_wings_and_nothing_loose():
    loose = sorted(os.path.basename(f) for f in glob.glob(os.path.join(ROOT, "r3", "*.py")))
    assert loose == sorted(["__init__.py", "errors.py"] + [f"{e}.py" for e in ENTRY_POINTS])
    folders = {d for d in os.listdir(os.path.join(ROOT, "r3")) if os.path.isdir(os.path.join(ROOT, "r3", d))
               and d != "__pycache__"}
    assert folders == set(WINGS)
    for wing in WINGS:  # each wing says what it holds and what it may import
        doc = ast.get_docstring(ast.parse(open(os.path.join(ROOT, "r3", wing, "__init__.py")).read()))
        assert doc and doc.startswith(f"{wing}/") and "import" in doc, f"r3/{wing}/__init__.py: no docstring"
    top = ast.get_docstring(ast.parse(open(os.path.join(ROOT, "r3", "__init__.py")).read()))
    at = [top.index(f"  {w}/") for w in WINGS]
    assert at == sorted(at), "r3/__init__.py lists the wings in another order than this test holds"


def test_command_entry_points_hold_no_code():
    for name in ENTRY_POINTS:
        path = os.path.join(ROOT, "r3", f"{name}.py")
        body = ast.parse(open(path).read()).body
        doc, *stmts, main = body
        assert isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant), f"{path}: no docstring"
        assert all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in stmts), f"{path}: more than imports"
        assert isinstance(main, ast.If) and ast.unparse(main.test) == "__name__ == '__main__'", path
        assert len(main.body) == 1 and "main" in ast.unparse(main.body[0]), f"{path}: more than calling main"
        assert {m for _, m in imports(path, "r3")} == {"r3.errors", next(f"r3.{w}.{name}" for w in WINGS if
                                                                         os.path.exists(os.path.join(ROOT, "r3", w,
                                                                                                     f"{name}.py")))}


def test_imports_run_one_way_between_wings():
    rank = {w: i for i, w in enumerate(WINGS)}
    bad = []
    for wing in WINGS:
        for f in sorted(glob.glob(os.path.join(ROOT, "r3", wing, "*.py"))):
            for line, mod in imports(f, "r3"):
                parts = mod.split(".")
                target = parts[1] if len(parts) > 1 else "r3"
                where = f"{os.path.relpath(f, ROOT)}:{line} imports {mod}"
                if target == "errors" or (target in rank and rank[target] <= rank[wing]):
                    continue
                if target in rank:
                    bad.append(f"{where}: {target}/ sits above {wing}/ (bottom to top: {' < '.join(WINGS)})")
                else:
                    bad.append(f"{where}: a wing imports wings and r3.errors, not {mod}")
    assert bad == [], "\n".join(bad)


def test_files_and_functions_stay_short():
    for f in r3_files() + [os.path.join(ROOT, x) for x in ("train.py", "rollout.py")]:
        src = open(f).read()
        if "/r3/" in f:
            assert src.count("\n") < 400, f"{f}: {src.count(chr(10))} lines"
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                assert n <= 60, f"{f}:{node.lineno} {node.name} is {n} lines"


def experiments_files() -> list[str]:
    return sorted(glob.glob(os.path.join(ROOT, "experiments", "**", "*.py"), recursive=True))


def experiments_module(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel.removesuffix(".__init__")


def test_experiments_are_one_package_per_study_that_imports_no_other():
    packages = sorted(os.path.basename(os.path.dirname(f))
                      for f in glob.glob(os.path.join(ROOT, "experiments", "*", "__init__.py")))
    assert packages == sorted(STUDIES)
    bad = []
    for f in experiments_files():
        parts = experiments_module(f).split(".")
        study = parts[1] if len(parts) > 1 and parts[1] in STUDIES else None  # None: a shared module at the top
        for line, mod in imports(f, "experiments"):
            other = mod.split(".")[1] if "." in mod else None
            gathers = experiments_module(f) == "experiments.registry" and mod == f"experiments.{other}.entries"
            if other in STUDIES and other != study and not gathers:  # the registry gathers each study's entries
                bad.append(f"{os.path.relpath(f, ROOT)}:{line} imports {mod}: "
                           + ("a shared module imports no study" if study is None else "another study's module"))
    assert bad == [], "\n".join(bad)
    for s in STUDIES:  # `python -m experiments.STUDY`, and a docstring that says what the study holds
        assert os.path.exists(os.path.join(ROOT, "experiments", s, "__main__.py")), s
        assert ast.get_docstring(ast.parse(open(os.path.join(ROOT, "experiments", s, "__init__.py")).read())), s


def test_experiments_have_no_import_circle_no_path_edits_and_short_study_files():
    graph = {experiments_module(f): {m for _, m in imports(f, "experiments")} for f in experiments_files()}
    no_cycles(graph)
    for f in experiments_files() + r3_files() + glob.glob(os.path.join(ROOT, "tests", "*.py")):
        for node in ast.walk(ast.parse(open(f).read())):
            if isinstance(node, ast.Attribute) and ast.unparse(node) == "sys.path":
                raise AssertionError(f"{os.path.relpath(f, ROOT)}:{node.lineno} edits sys.path")
    for s in STUDIES:
        for f in glob.glob(os.path.join(ROOT, "experiments", s, "*.py")):
            n = open(f).read().count("\n")
            assert n <= 400, f"{os.path.relpath(f, ROOT)}: {n} lines"
