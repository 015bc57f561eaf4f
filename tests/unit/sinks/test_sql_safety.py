"""Every SQL statement is parameterized and every name in one is validated.

A static check over every package: SQL text (a string with SQL keywords) built with an
f-string, ``str.format``, ``%`` or ``+`` may only interpolate values that do not depend
on a function's inputs, unless they pass a validator (:func:`perftracker_ml.sinks.identifiers.ident`,
``on_cluster``, ``int``). Inputs are followed through assignments, loops and calls inside
each function (a small taint analysis); an object's own attributes (``self.name``) are not
inputs: tables validate their names at construction (``Table.__post_init__``). Values reach ClickHouse as bound parameters only;
the tests below throw hostile names and values at the code that builds SQL.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from perftracker_ml.schemas.errors import ConfigError
from perftracker_ml.sinks.identifiers import BadIdentifier, ident
from perftracker_ml.sinks.queries import QUERIES, run_query
from perftracker_ml.sinks.schema import Table, on_cluster
from perftracker_ml.sinks.store import QueryResult, Store, StoreTarget

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("schemas", "collectors", "streams", "sinks", "grafana", "deploy")
SQL = re.compile(r"\b(SELECT|INSERT INTO|CREATE|ALTER TABLE|DROP|DELETE|FROM|WHERE|ON CLUSTER)\b")
# each validates, casts or maps to a fixed set (_ch_type: an Avro type -> one of a few ClickHouse types)
SANITIZERS = {"ident", "on_cluster", "int", "float", "len", "ttl_expr", "_ch_type"}
HOSTILE = ["x; DROP TABLE incidents; --", "a`b", "a b", "", "1abc", "täble", "t\nx", "x" * 200, "a.b", "{job:String}"]


def _is_sql(text: object) -> bool:
    return isinstance(text, str) and bool(SQL.search(text))


class _Function:
    """Which names of one function depend on its inputs (parameters other than self/cls)."""

    def __init__(self, fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        args = fn.args
        self.tainted = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)} - {"self", "cls"}
        self.tainted |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        body = fn.body if isinstance(fn.body, list) else [fn.body]
        changed = True
        while changed:  # flow-insensitive: to a fixed point
            changed = False
            for node in (n for stmt in body for n in ast.walk(stmt)):
                for target, value in _bindings(node):
                    names = {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
                    if self.taints(value) and not names <= self.tainted:
                        self.tainted |= names
                        changed = True

    def taints(self, node: ast.AST | None) -> bool:
        if node is None or isinstance(node, ast.Constant):
            return False
        if isinstance(node, ast.Name):
            return node.id in self.tainted
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in SANITIZERS:
                return False
            base = func.value if isinstance(func, ast.Attribute) else None
            return self.taints(base) or any(self.taints(a) for a in node.args) or \
                any(self.taints(k.value) for k in node.keywords)
        if isinstance(node, ast.Subscript):  # a constant table indexed by an input is still a constant
            return self.taints(node.value)
        if isinstance(node, ast.IfExp):  # the condition only chooses between the two
            return self.taints(node.body) or self.taints(node.orelse)
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):  # its loop variables are bound above
            return self.taints(node.elt)
        if isinstance(node, ast.DictComp):
            return self.taints(node.key) or self.taints(node.value)
        return any(self.taints(child) for child in ast.iter_child_nodes(node))


def _bindings(node: ast.AST) -> list[tuple[ast.AST, ast.AST | None]]:
    if isinstance(node, ast.Assign):
        return [(t, node.value) for t in node.targets]
    if isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
        return [(node.target, node.value)]
    if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        return [(node.target, node.iter)]
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return [(i.optional_vars, i.context_expr) for i in node.items if i.optional_vars is not None]
    return []


def sql_built_from_inputs(source: str, where: str = "<code>") -> list[str]:
    """``file:line: expression`` for each SQL text built from a function's unvalidated inputs."""
    tree = ast.parse(source)
    constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                 and isinstance(n.value, ast.Constant) for t in n.targets if isinstance(t, ast.Name)}
    quiet: set[int] = set()  # nodes inside raise statements and log calls: messages, not SQL
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) or (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                                           and getattr(node.func.value, "id", "") in ("log", "logging")):
            quiet |= {id(n) for n in ast.walk(node)}

    def text_of(node: ast.AST) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name) and isinstance(constants.get(node.id), str):
            return constants[node.id]
        if isinstance(node, ast.JoinedStr):
            return "".join(text_of(v) for v in node.values)
        if isinstance(node, ast.BinOp):
            return text_of(node.left) + text_of(node.right)
        return ""

    found = []
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    for fn in functions:
        if getattr(fn, "name", "") in SANITIZERS:
            continue  # a validator builds from what it has just checked
        scope = _Function(fn)
        for node in (n for stmt in (fn.body if isinstance(fn.body, list) else [fn.body]) for n in ast.walk(stmt)):
            if id(node) in quiet:
                continue
            parts: list[ast.AST] = []
            if isinstance(node, ast.JoinedStr) and _is_sql(text_of(node)):
                parts = [v.value for v in node.values if isinstance(v, ast.FormattedValue)]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format" \
                    and _is_sql(text_of(node.func.value)):
                parts = [*node.args, *(k.value for k in node.keywords)]
            elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)) and _is_sql(text_of(node)):
                parts = [node.left, node.right]
            found += [f"{where}:{p.lineno}: {ast.unparse(p)}" for p in parts if scope.taints(p)]
    return found


def test_no_sql_is_built_from_unvalidated_input():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += sql_built_from_inputs(path.read_text(), str(path.relative_to(ROOT)))
    assert found == [], "SQL text built from inputs (bind a parameter, or validate a name with ident()):\n" + \
        "\n".join(found)


def test_the_check_finds_what_it_should():
    bad = '''
def rows(store, job, table):
    where = "job = '" + job + "'"
    store.query(f"SELECT * FROM {table} WHERE " + where)
    store.query("SELECT count() FROM t WHERE job = '%s'" % job)
    store.query("SELECT * FROM {t}".format(t=table.strip()))
    for name in [table]:
        store.command(f"DROP TABLE {name}")
'''
    good = '''
TABLE = "incidents"
def rows(store, job, table, days, cluster):
    store.query(f"SELECT * FROM {TABLE} WHERE job = {{job:String}}", {"job": job})
    store.query(f"SELECT * FROM {ident(table)} WHERE d < {int(days)}{on_cluster(cluster)}")
    raise ValueError(f"cannot DROP TABLE {table}")
'''
    found = {f.split(": ", 1)[1] for f in sql_built_from_inputs(bad)}
    assert found == {"job", "table", "where", "f'SELECT * FROM {table} WHERE '", "table.strip()", "name"}
    assert sql_built_from_inputs(good) == []


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_never_reach_sql(name):
    with pytest.raises(BadIdentifier):
        ident(name)
    with pytest.raises(ValueError):
        Table(name, (("job", "String"),), "MergeTree", "job")
    with pytest.raises(ValueError):
        Table("t", (("job", "String"), (name, "String")), "MergeTree", "job")

    class Refusing:  # the driver is never reached
        def __getattr__(self, attr):
            raise AssertionError(f"driver called: {attr}")

    store = Store(StoreTarget("chdb"), Refusing())
    with pytest.raises(BadIdentifier):
        store.insert(name, ["job"], [["j"]])
    with pytest.raises(BadIdentifier):
        store.insert("incidents", ["job", name], [["j"], ["x"]])
    with pytest.raises(BadIdentifier):
        store.raw_insert(name, b"", "Avro")


@pytest.mark.parametrize("name", ["x`; DROP TABLE t; --", "a b", "c\n", ""])
def test_hostile_cluster_names_are_refused(name):
    if not name:
        assert on_cluster(name) == ""
        return
    with pytest.raises(ConfigError):
        on_cluster(name)


@pytest.mark.parametrize("value", ["job'; DROP TABLE incidents; --", "{job:String}", "x' OR '1'='1", "\x00", "%s"])
def test_named_queries_bind_hostile_values_as_parameters(value):
    seen: list[tuple[str, dict]] = []

    class Recording(Store):
        def __init__(self):
            pass

        def query(self, sql, parameters=None):
            seen.append((sql, parameters or {}))
            return QueryResult([], [])

    for name, q in QUERIES.items():
        params = {"job": value} if "job" in q.params else {}
        run_query(Recording(), name, params)
        sql, bound = seen[-1]
        assert sql == q.sql  # the text is the constant; the value travels apart
        if params:
            assert bound["job"] == value
