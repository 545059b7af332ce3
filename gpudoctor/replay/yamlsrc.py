"""YAML loading that remembers the line of every key, for one-line errors.

PyYAML's node marks carry line numbers; the safe constructor drops them. We keep
them in a ``dict`` subclass so validation can say ``config.yaml:12: training.x``.

Aliases share one object when loaded, but everything after (``dataclasses.asdict``,
``json.dumps``, a transformers config) copies each use: ten nested lists of ten
aliases are 10^10 values. The node graph is measured, aliases expanded, before
anything is built, and refused past :data:`MAX_EXPANDED_NODES` (a real config has
a few hundred) or when an alias refers to itself.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any

import yaml

from gpudoctor.common.errors import UserError

MAX_EXPANDED_NODES = 100_000


class LinedDict(dict[Any, Any]):
    """A mapping from YAML with the 1-based line of itself and of each key."""

    line: int = 0
    key_lines: dict[Any, int]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.key_lines = {}


class _LineLoader(yaml.SafeLoader):  # type: ignore[misc]  # yaml: no stubs installed, its classes are Any
    """SafeLoader whose mappings are ``LinedDict`` and refuse duplicate keys."""

    source_name = "<config>"


def _construct_map(loader: _LineLoader, node: yaml.MappingNode) -> Iterator[LinedDict]:
    data = LinedDict()
    data.line = node.start_mark.line + 1
    yield data
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, Hashable):
            raise UserError(f"{_name(loader)}:{line}: a key must be a plain name, not {key!r}")
        if key in data.key_lines:
            first = data.key_lines[key]
            raise UserError(
                f"{_name(loader)}:{line}: key {key!r} appears twice (first on line {first})"
            )
        data.key_lines[key] = line
        data[key] = loader.construct_object(value_node, deep=True)


_LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_map)


def _name(loader: _LineLoader) -> str:
    return loader.source_name


def load_yaml(text: str, source_name: str = "<config>") -> Any:
    """Parse ``text``; any YAML problem becomes a one-line ``UserError`` with its line."""
    try:
        loader = _LineLoader(text)  # the reader already refuses control characters here
    except yaml.YAMLError as exc:
        raise UserError(f"{source_name}: not valid YAML: {_one_line(exc)}") from None
    loader.source_name = source_name
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, source_name)
        return loader.construct_document(node)
    except UserError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = " ".join((exc.problem or exc.context or "invalid YAML").split())
        problem = "".join(c if c.isprintable() else repr(c)[1:-1] for c in problem)
        raise UserError(f"{source_name}{line}: not valid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{source_name}: not valid YAML: {_one_line(exc)}") from None
    except (ValueError, TypeError, OverflowError) as exc:
        # e.g. a date-like scalar "2024-13-45" that the timestamp constructor rejects
        raise UserError(f"{source_name}: a value could not be read: {_one_line(exc)}") from None
    except RecursionError:
        raise UserError(f"{source_name}: nesting too deep to be a gpudoctor config") from None
    finally:
        loader.dispose()


def _check_expansion(root: yaml.Node, source_name: str, cap: int | None = None) -> None:
    """Refuse a document whose aliases, expanded, make more than ``cap`` nodes (or a cycle)."""
    cap = MAX_EXPANDED_NODES if cap is None else cap
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            line = node.start_mark.line + 1
            raise UserError(f"{source_name}:{line}: an alias refers to the node that contains it; "
                            "a config cannot be recursive")
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        open_nodes.discard(key)
        if total > cap:
            raise UserError(f"{source_name}: the config expands to more than {cap:,} values through its "
                            "aliases (*name); a real config has a few hundred: write the values out, "
                            "or use fewer nested aliases")
        sizes[key] = total
        return total

    size(root)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:200]
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
