"""The C maker of slotted values (ext/workloads/slots_native.c) against `trusted_values`' Python reference
(libra/workloads/trace.py): the same objects for any rows and values, and the same verdict on a class: an abstract
class has no instances (the C code made them), and a class whose own `__new__` is written in Python is made as
`object.__new__` makes it (the C code refused it, and `trusted_values` has no fallback)."""

from __future__ import annotations

import abc

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libra.workloads import trace


@pytest.fixture(params=["c", "python"])
def maker(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(trace, "_SLOTS_NATIVE", None)
    else:
        assert trace._load_slots_native() is not None, "libra.workloads._slots_native is not built: pip install -e ."
        monkeypatch.setattr(trace, "_SLOTS_NATIVE", trace._load_slots_native())
    return request.param


@attrs.frozen
class Pair:
    a: object
    b: object


class Shape(abc.ABC):
    __slots__ = ("side",)

    @abc.abstractmethod
    def area(self) -> float: ...


class Guarded:
    """A slotted class whose own `__new__` refuses every call: `object.__new__` never calls it."""

    __slots__ = ("x",)
    x: int

    def __new__(cls, *args: object) -> Guarded:
        raise AssertionError("object.__new__ does not call a class's own __new__")


class GuardedChild(Guarded):
    __slots__ = ("y",)
    y: int


def _reference(cls: type, fields: tuple[str, ...], columns: tuple, monkeypatch: pytest.MonkeyPatch) -> list:
    with monkeypatch.context() as m:
        m.setattr(trace, "_SLOTS_NATIVE", None)
        return trace.trusted_values(cls, fields, columns)


values = st.one_of(
    st.none(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(values, values), max_size=40))
def test_the_c_maker_makes_what_the_reference_makes(rows) -> None:
    native = trace._load_slots_native()
    assert native is not None
    columns = (tuple(a for a, _ in rows), tuple(b for _, b in rows))
    made = native.make(Pair, ("a", "b"), columns)
    with pytest.MonkeyPatch.context() as m:
        expected = _reference(Pair, ("a", "b"), columns, m)
    assert len(made) == len(expected) == len(rows)
    for got, want in zip(made, expected, strict=True):
        assert type(got) is type(want) is Pair
        assert got.a is want.a and got.b is want.b  # (the values given, NaN included, not copies)


def test_an_abstract_class_has_no_instances(maker) -> None:
    with pytest.raises(TypeError, match="abstract"):
        trace.trusted_values(Shape, ("side",), ([1.0],))


def test_a_class_with_its_own_python_new_is_made_as_object_new_makes_it(maker) -> None:
    (made,) = trace.trusted_values(GuardedChild, ("y",), ([2],))
    assert type(made) is GuardedChild and made.y == 2
    with pytest.raises(AttributeError):
        made.x  # noqa: B018 (unset, as object.__new__ leaves it)


@pytest.mark.parametrize("cls", [dict, int, type("Sub", (dict,), {"__slots__": ()})])
def test_a_class_object_new_refuses_is_refused(cls) -> None:
    native = trace._load_slots_native()
    assert native is not None
    with pytest.raises(TypeError, match="allocation"):
        native.make(cls, (), ())
    with pytest.raises(TypeError, match="not safe"):
        object.__new__(cls)


def test_columns_of_different_lengths_are_refused_alike(maker) -> None:
    with pytest.raises(ValueError):
        trace.trusted_values(Pair, ("a", "b"), ([1, 2], [3]))


def test_a_field_inherited_from_a_base_class_is_set_by_both_makers(maker) -> None:
    """`GuardedChild` declares `y` and inherits `x`: the reference looked `x` up in the child's own namespace only
    (a KeyError), while the C maker set it."""
    made = trace.trusted_values(GuardedChild, ("x", "y"), ([1, 2], [3, 4]))
    assert [(v.x, v.y) for v in made] == [(1, 3), (2, 4)] and all(type(v) is GuardedChild for v in made)


class Described:
    """A field that is a property, not a plain slot: the C maker refuses the class and the reference makes it."""

    __slots__ = ("_x",)

    @property
    def x(self) -> int:
        return self._x

    @x.setter
    def x(self, value: int) -> None:
        self._x = value


def test_a_class_the_c_maker_refuses_is_made_by_the_reference(maker) -> None:
    made = trace.trusted_values(Described, ("x",), ([5, 6],))
    assert [v.x for v in made] == [5, 6]
