"""Every rule class runs: the catalog is an explicit list, and this test keeps it whole."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import gpudoctor.rules
from gpudoctor.rules import RULES, Rule


def _rule_classes() -> set[type[Rule]]:
    found = set()
    for info in pkgutil.iter_modules(gpudoctor.rules.__path__, "gpudoctor.rules."):
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, Rule) and obj is not Rule and obj.__module__ == module.__name__ \
                    and not obj.__name__.startswith("_"):
                found.add(obj)
    return found


def test_every_rule_class_is_in_the_catalog_once_with_its_own_name():
    assert _rule_classes() - set(RULES) == set(), "add these rule classes to gpudoctor/rules/catalog.py"
    assert len(RULES) == len(set(RULES))
    names = [cls.name for cls in RULES]
    assert len(names) == len(set(names)), names
    assert all(cls.fires_when and cls.fix_from for cls in RULES)


def test_the_readme_rules_table_is_the_catalogs():
    from gpudoctor.rules.catalog import rules_table

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert rules_table() in readme, "regenerate: python -c 'from gpudoctor.rules.catalog import rules_table; print(rules_table())'"
