"""The explicit primitive registry.

A primitive is a class with a unique ``name`` and an ``apply(sch, ...)`` static method whose
docstring documents preconditions, the schedule before/after, and the errors it raises. Registering
it (``@register_primitive``) makes it a method of every :class:`~slapo.Schedule`::

    @slapo.register_primitive
    class Freeze(slapo.Primitive):
        name = "freeze"

        @staticmethod
        def apply(sch, *, requires_grad: bool = False) -> None:
            \"\"\"Freeze every parameter of the module.\"\"\"
            for p in sch.mod.parameters():
                p.requires_grad_(requires_grad)

    sch["bert.embeddings"].freeze()

Built-in primitives are registered by the explicit imports in ``slapo/primitives/__init__.py``
(no directory scanning), and each is declared on the class too
(``shard = primitive_method(Shard.apply)`` in :mod:`slapo.primitives.methods`), so that type
checkers know ``sch.shard`` and its argument types; a primitive registered at run time is bound
with the same :class:`PrimitiveMethod`, which ``help()`` and ``inspect.signature`` see alike.
"""

from __future__ import annotations

import functools
import inspect
from typing import (Any, Callable, ClassVar, Concatenate, Dict, Generic, List, Optional,
                    ParamSpec, Type, TypeVar, Union, overload)

from ..errors import PrimitiveError, RegistryError

__all__ = ["Primitive", "register_primitive", "list_primitives", "get_primitive",
           "check_original_kwargs", "PrimitiveMethod", "primitive_method"]

_REGISTRY: Dict[str, Type["Primitive"]] = {}
_BINDERS: List[Callable[[Type["Primitive"]], None]] = []

P = TypeVar("P", bound=Type["Primitive"])
Args = ParamSpec("Args")
R = TypeVar("R")


class Primitive:
    """Base class of schedule primitives.

    Subclasses set ``name`` and implement ``apply(sch, *args, **kwargs)``. ``record`` says whether
    a call is recorded in the schedule history (queries such as ``find`` are not).
    ``original_kwargs`` maps keyword arguments of the original Slapo's primitive that this one
    spells differently (or does not need) to the hint naming ours (``docs/porting.md``).
    """

    name: ClassVar[str] = ""
    record: ClassVar[bool] = True
    original_kwargs: ClassVar[Dict[str, str]] = {}

    @staticmethod
    def apply(sch, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - interface
        raise NotImplementedError


def register_primitive(cls: P) -> P:
    """Class decorator that registers a primitive and binds it as a ``Schedule`` method.

    Raises:
        RegistryError: ``cls`` is not a ``Primitive`` subclass, has no name, or the name is taken.
    """
    if not (isinstance(cls, type) and issubclass(cls, Primitive)):
        raise RegistryError(
            f"register_primitive expects a Primitive subclass, got {cls!r}",
            hint="subclass slapo.Primitive and set `name` and a static `apply(sch, ...)`",
        )
    name = cls.name
    if not name or not name.isidentifier():
        raise RegistryError(
            f"primitive class {cls.__name__} has an invalid name {name!r}",
            hint="set `name = 'my_primitive'` (a Python identifier) on the class",
        )
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise RegistryError(
            f"a primitive named '{name}' is already registered ({_REGISTRY[name].__qualname__})",
            hint="choose another name",
        )
    if not callable(getattr(cls, "apply", None)) or cls.apply is Primitive.apply:
        raise RegistryError(
            f"primitive '{name}' does not implement apply(sch, ...)",
            hint="define `@staticmethod def apply(sch, ...)` on the class",
        )
    previous = _REGISTRY.get(name)
    _REGISTRY[name] = cls
    try:
        for bind in _BINDERS:
            bind(cls)
    except Exception:
        if previous is None:
            del _REGISTRY[name]
        raise
    return cls


def list_primitives(name_only: bool = True) -> Union[List[str], Dict[str, Type[Primitive]]]:
    """Names of the registered primitives (or a ``name -> class`` dict with ``name_only=False``)."""
    return sorted(_REGISTRY) if name_only else dict(sorted(_REGISTRY.items()))


def get_primitive(name: str) -> Type[Primitive]:
    """The primitive class registered as ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise RegistryError(
            f"no primitive named '{name}'",
            hint=f"registered primitives: {', '.join(sorted(_REGISTRY))}",
        ) from None


def check_original_kwargs(cls: Type[Primitive], sch: Any, kwargs: Dict[str, Any]) -> None:
    """Raise PrimitiveError for a keyword of the original Slapo's primitive (see
    ``Primitive.original_kwargs``), before Python's bare ``TypeError`` would."""
    for key in kwargs:
        if key in cls.original_kwargs:
            raise PrimitiveError(
                f"{key}= is an argument of the original Slapo's {cls.name}(), spelled "
                "differently here", path=getattr(sch, "path", None),
                call=f"{cls.name}({key}=...)", module=getattr(sch, "mod", None),
                hint=cls.original_kwargs[key])


def on_register(binder: Callable[[Type[Primitive]], None]) -> None:
    """Call ``binder(cls)`` for every primitive registered so far and in the future."""
    _BINDERS.append(binder)
    for cls in list(_REGISTRY.values()):
        binder(cls)


class PrimitiveMethod(Generic[Args, R]):
    """A primitive as a method of ``Schedule``: ``sch.<name>(...)`` runs the primitive through
    ``Schedule._call_primitive`` (argument checks, history). Looked up on the class it is a plain
    function named ``Schedule.<name>`` with ``apply``'s docstring and signature (``sch`` renamed
    ``self``), so ``help()`` and ``inspect.signature`` show them; to a type checker its type is
    ``apply``'s, so calls are checked against the primitive's own signature (one source)."""

    def __init__(self, cls: Type[Primitive]) -> None:
        self.primitive = cls

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return self._call_primitive(cls, args, kwargs)

        self.function = copy_metadata(method, cls)

    def __set_name__(self, owner: type, name: str) -> None:
        if name != self.primitive.name:
            raise RegistryError(f"primitive '{self.primitive.name}' declared as '{name}'",
                                hint=f"write `{self.primitive.name} = primitive_method(...)`")

    @overload
    def __get__(self, obj: None, owner: Optional[type] = None
                ) -> Callable[Concatenate[Any, Args], R]: ...

    @overload
    def __get__(self, obj: object, owner: Optional[type] = None) -> Callable[Args, R]: ...

    def __get__(self, obj: Any, owner: Optional[type] = None) -> Callable[..., Any]:
        # the function on the class, a bound method on an instance, as for a def
        return self.function.__get__(obj, owner)


def primitive_method(apply: Callable[Concatenate[Any, Args], R]) -> PrimitiveMethod[Args, R]:
    """Declare a registered primitive as a method, in a class body, by its ``apply``:
    ``shard = primitive_method(Shard.apply)`` (the attribute name must be the primitive's name).
    Given the function, a type checker takes the method's type from it.

    Raises:
        RegistryError: ``apply`` is not the ``apply`` of a registered primitive.
    """
    for cls in _REGISTRY.values():
        if cls.apply is apply:
            return PrimitiveMethod(cls)
    raise RegistryError(f"{apply!r} is not the apply() of a registered primitive",
                        hint="decorate its class with @register_primitive first")


def method_signature(cls: Type[Primitive]) -> inspect.Signature:
    """The signature of ``cls.apply`` as a method (the leading ``sch`` renamed ``self``)."""
    sig = inspect.signature(cls.apply)
    params = list(sig.parameters.values())
    if params:
        params[0] = params[0].replace(name="self")
    return sig.replace(parameters=params)


def copy_metadata(wrapper: Callable, cls: Type[Primitive]) -> Callable:
    """Give ``wrapper`` the name, docstring and signature of the primitive."""
    functools.update_wrapper(wrapper, cls.apply)
    wrapper.__name__ = cls.name
    wrapper.__qualname__ = f"Schedule.{cls.name}"
    wrapper.__signature__ = method_signature(cls)  # type: ignore[attr-defined]
    return wrapper
