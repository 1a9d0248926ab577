"""Repo-level documents: dependencies before dependents, cycles broken deterministically, path markers."""

from glmstack.data.repo import FILE_SEP, REPO_NAME, dependencies, dependency_order, repo_document

FILES = {
    "a.py": "from . import b\n",
    "b.py": "import pkg.c\n",
    "c.py": "X = 1\n",
    "d.py": "from .e import f\n",
    "e.py": "from .d import g\n",
    "sub/__init__.py": "from ..c import X\n",
}


def test_dependencies_resolve_relative_and_absolute_imports():
    deps = dependencies(FILES, "pkg")
    assert deps["a.py"] == {"b.py"} and deps["b.py"] == {"c.py"} and deps["sub/__init__.py"] == {"c.py"}
    assert deps["d.py"] == {"e.py"} and deps["e.py"] == {"d.py"}


def test_order_puts_dependencies_first_and_is_seeded():
    order = dependency_order(dependencies(FILES, "pkg"), seed=0)
    assert order.index("c.py") < order.index("b.py") < order.index("a.py")
    assert order.index("c.py") < order.index("sub/__init__.py")
    assert order == dependency_order(dependencies(FILES, "pkg"), seed=0)
    assert sorted(order) == sorted(FILES)


def test_document_format():
    doc = repo_document("pkg", FILES)
    assert doc.startswith(f"{REPO_NAME}pkg\n{FILE_SEP}")
    assert doc.count(FILE_SEP) == len(FILES)
    assert f"{FILE_SEP}c.py\nX = 1\n" in doc
