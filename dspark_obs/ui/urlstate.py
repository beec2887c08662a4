"""Selections kept in the page URL (``st.query_params``), so a view can be shared by its address.

A widget made here reads its first value from the URL (``?runs=a&runs=b``,
``?sweep=s``) and writes every change back; a selection equal to its default is
left out of the URL, so a plain address shows the default view.
"""

from __future__ import annotations

from typing import Any, Sequence

import streamlit as st

__all__ = ["selectbox", "multiselect", "segmented_control", "toggle", "url_values"]


def url_values(key: str) -> list[str]:
    """Every value of ``key`` in the URL (``?key=a&key=b``), in order."""
    return list(st.query_params.get_all(key))


def _current(key: str) -> list[str] | None:
    """The widget's value this session (it outlives a page switch, which drops the URL's parameters)."""
    value = st.session_state.get(f"url-{key}")
    if value is None:
        return None
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def _write(key: str, values: list[str], default: list[str]) -> None:
    if values == default:
        if key in st.query_params:
            del st.query_params[key]
    elif url_values(key) != values:
        st.query_params[key] = values if len(values) != 1 else values[0]


def selectbox(label: str, options: Sequence[Any], *, key: str, help: str | None = None, container=st) -> Any:
    """``st.selectbox`` whose choice lives in the URL as ``?key=value`` (default: the first option)."""
    options = list(options)
    names = [str(o) for o in options]
    wanted = _current(key) or url_values(key)
    index = names.index(wanted[0]) if wanted and wanted[0] in names else 0
    value = container.selectbox(label, options, index=index, key=f"url-{key}", help=help)
    _write(key, [str(value)] if value is not None else [], names[:1])
    return value


def multiselect(label: str, options: Sequence[Any], *, key: str, help: str | None = None, container=st) -> list:
    """``st.multiselect`` whose selection lives in the URL as repeated ``?key=`` (default: every option)."""
    options = list(options)
    names = [str(o) for o in options]
    current = _current(key)
    wanted = set(url_values(key) if current is None else current)
    default = [o for o, n in zip(options, names) if n in wanted] if wanted & set(names) or current == [] else options
    value = container.multiselect(label, options, default=default, key=f"url-{key}", help=help)
    _write(key, [str(v) for v in value], names)
    return value


def segmented_control(label: str, options: Sequence[str], *, key: str, help: str | None = None, container=st) -> str:
    """``st.segmented_control`` of one choice kept in the URL as ``?key=value`` (default: the first option).

    A click on the chosen option again would leave nothing chosen: it stays on its choice instead.
    """
    options = list(options)
    wanted = _current(key) or url_values(key)
    start = wanted[0] if wanted and wanted[0] in options else options[0]
    value = container.segmented_control(label, options, default=start, key=f"url-{key}", help=help) or start
    _write(key, [value], options[:1])
    return value


def toggle(label: str, *, key: str, default: bool = False, help: str | None = None, container=st) -> bool:
    """``st.toggle`` kept in the URL as ``?key=1`` / ``?key=0`` when it differs from ``default``."""
    wanted = url_values(key)
    start = bool(st.session_state[f"url-{key}"]) if f"url-{key}" in st.session_state else (
        wanted[0] == "1" if wanted else default)
    value = container.toggle(label, value=start, key=f"url-{key}", help=help)
    _write(key, ["1" if value else "0"], ["1" if default else "0"])
    return value
