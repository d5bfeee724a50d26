"""Every input rule of tokstream, shared by the fast path and the reference path.

The compiled kernel runs without bounds checks, so these functions are the only thing standing
between a caller's input and an out-of-range read: whatever they return is a 1-D, C-contiguous,
native-byte-order integer array whose every value is a lossless int64, and plain Python ints for
the controls. TypeError means "wrong kind of thing", ValueError "right kind, wrong value"; every
message names the argument and the offending value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, TypeVar

import numpy as np

INT64_MIN = int(np.iinfo(np.int64).min)
INT64_MAX = int(np.iinfo(np.int64).max)
INT32_MAX = int(np.iinfo(np.int32).max)
SEED_MAX = 2**32 - 1

# Floats compare against these exact powers of two: float(INT64_MAX) rounds up to 2**63, which
# is one past the int64 range, so "> INT64_MAX" would let 2**63 through.
_FLOAT_INT64_LOW = -(2.0**63)
_FLOAT_INT64_HIGH = 2.0**63

# Integer dtypes the kernel reads in place. Any other integer dtype (there are none on common
# platforms) is converted to int64 once.
KERNEL_DTYPES = frozenset(
    np.dtype(t)
    for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
)

# Values are scanned in chunks of this many elements so that validating a memory map or a huge
# float corpus never builds a whole-corpus temporary.
SCAN_CHUNK = 1 << 20


# ---------------------------------------------------------------------------------------------
# Scalar controls


def shown(value: Any) -> str:
    """``repr(value)`` for an error message.

    Python refuses to print an int of more than ``sys.get_int_max_str_digits()`` digits (4300 by
    default) and raises its own ValueError instead, which would hide the message naming the
    argument; such an int is described by its size.
    """
    try:
        return repr(value)
    except ValueError:
        if not isinstance(value, int):
            raise
        sign = "a negative" if value < 0 else "an"
        return f"{sign} int of {value.bit_length()} bits"


def exact_int(value: Any, name: str) -> int:
    """Return ``value`` as a plain ``int``; reject bools, non-numbers and inexact floats.

    Truncating ``block=3.7`` to 3 would silently change what is streamed, so a float is accepted
    only when it holds an exact integer.
    """
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got bool {value!r}")
    # NumPy files timedelta64 under np.integer (its stubs do not): a duration is not a count.
    duration = isinstance(value, np.timedelta64)
    if isinstance(value, (int, np.integer)) and not duration:
        return int(value)
    if isinstance(value, (float, np.floating)):
        if not np.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
        as_int = int(value)
        if value != as_int:
            raise ValueError(f"{name} must be an exact integer, got {value!r}")
        return as_int
    raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")


def positive_int(value: Any, name: str) -> int:
    """An exact int >= 1 (``block`` and ``batch_size`` have no zero-work case)."""
    as_int = exact_int(value, name)
    if as_int <= 0:
        raise ValueError(f"{name} must be positive, got {shown(as_int)}")
    return as_int


def nonnegative_int(value: Any, name: str) -> int:
    """An exact int >= 0 (``epochs=0`` is an explicit no-op)."""
    as_int = exact_int(value, name)
    if as_int < 0:
        raise ValueError(f"{name} must be nonnegative, got {shown(as_int)}")
    return as_int


def seed_int(value: Any, name: str = "seed") -> int:
    """An exact int in ``[0, 2**32)``, the range ``numpy.random.RandomState`` accepts."""
    as_int = nonnegative_int(value, name)
    if as_int > SEED_MAX:
        raise ValueError(f"{name} must be at most 2**32 - 1 = {SEED_MAX}, got {shown(as_int)}")
    return as_int


def exact_bool(value: Any, name: str) -> bool:
    """A real bool: ``shuffle="false"`` from a config file must not mean "shuffle"."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")


def names_from(value: Any, name: str, allowed: Iterable[str]) -> tuple[str, ...]:
    """A tuple of distinct option strings, each from ``allowed`` (a lone string is refused)."""
    allowed = tuple(allowed)
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise TypeError(
            f"{name} must be a tuple of names from {allowed}, got {value!r} "
            f"({type(value).__name__})"
        )
    names = tuple(choice(item, f"{name}[{i}]", allowed) for i, item in enumerate(value))
    if len(set(names)) != len(names):
        raise ValueError(f"{name} names an extra twice: {names}")
    return names


Name = TypeVar("Name", bound=str)


def choice(value: Any, name: str, allowed: Iterable[Name]) -> Name:
    """One of a fixed set of option strings."""
    allowed = tuple(allowed)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {allowed}, got {value!r} ({type(value).__name__})")
    for option in allowed:
        if value == option:
            return option
    raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def token_id(value: int, dtype: np.dtype, name: str) -> int:
    """``value`` when a corpus of ``dtype`` can hold it as a token id, else a ValueError.

    Token ids are int64 values whatever the dtype (uint64 ones past 2**63 - 1 are refused when
    the corpus is made), so an id outside both ranges could never be read from the corpus.
    """
    info = np.iinfo(dtype)
    low, high = max(int(info.min), INT64_MIN), min(int(info.max), INT64_MAX)
    if not low <= value <= high:
        raise ValueError(
            f"{name} must be a token id of the corpus dtype {dtype} ([{low}, {high}]), got {value}"
        )
    return value


#: The dtypes a batch's tokens and position ids may be written in (``out_dtype=``).
#: The dtypes a batch is written in (``out_dtype=``).
OutDtypeName = Literal["int64", "int32"]
OUT_DTYPES: tuple[OutDtypeName, ...] = ("int64", "int32")


def out_dtype(value: Any, name: str = "out_dtype") -> OutDtypeName:
    """The name of the output dtype ``value`` spells (a str or an ``np.dtype``): ``"int64"``
    or ``"int32"``, native byte order; a TypeError for another kind, a ValueError for another
    dtype."""
    if not isinstance(value, (str, np.dtype)):
        raise TypeError(
            f"{name} must be 'int64' or 'int32' (a str or np.dtype), got {shown(value)} "
            f"({type(value).__name__})"
        )
    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = None
    for option in OUT_DTYPES:
        if dtype is not None and dtype == np.dtype(option) and dtype.isnative:
            return option
    raise ValueError(f"{name} must be 'int64' or 'int32', got {shown(value)}")


def integer_dtype(dtype: Any, name: str) -> np.dtype:
    """``dtype`` as an integer ``np.dtype`` (any size and byte order), else a TypeError.

    Kinds, not ``np.issubdtype``: NumPy files timedelta64 under ``np.integer``.
    """
    try:
        as_dtype: np.dtype = np.dtype(dtype)
    except (TypeError, ValueError) as exc:
        # ValueError: a malformed tuple such as ("i4", "x") ("invalid shape in fixed-type tuple").
        raise TypeError(f"{name} must be an integer dtype, got {dtype!r} ({exc})") from None
    if as_dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer dtype, got {as_dtype}")
    return as_dtype


# ---------------------------------------------------------------------------------------------
# Token arrays


def token_array(token_ids: Any, name: str = "token_ids") -> np.ndarray:
    """Validate ``token_ids`` and return it as a 1-D array the kernel can read in place.

    Integer arrays keep their dtype and are not copied when already C-contiguous in native byte
    order (a non-contiguous or byte-swapped array is copied once). Float arrays holding exact
    integers, and Python sequences, are converted once to int64. Every value of the result is a
    lossless int64.

    Raises
    ------
    TypeError
        A masked array, or a dtype that is not integer or floating (bool, complex, object,
        strings, datetimes, timedeltas), even when empty; a sequence holding a bool or a
        non-number.
    ValueError
        Not 1-D; a NaN or infinity; a fractional value; a value outside the int64 range.
    """
    if isinstance(token_ids, np.ma.MaskedArray):
        raise TypeError(f"{name} must not be a masked array: its mask would be silently ignored")
    if isinstance(token_ids, np.ndarray):
        ids = token_ids
    else:
        ids = _sequence_to_array(token_ids, name)
    if ids.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of token ids, got shape {ids.shape}")
    # Kinds, not np.issubdtype: NumPy files timedelta64 under np.integer.
    if ids.dtype.kind in "iu":
        return _integer_tokens(ids, name)
    if ids.dtype.kind == "f":
        return _float_tokens(ids, name)
    raise TypeError(
        f"{name} must be an integer or floating array of token ids, got dtype {ids.dtype}"
    )


def _sequence_to_array(token_ids: Any, name: str) -> np.ndarray:
    """Convert a non-array input without NumPy's lossy guesses.

    ``np.asarray([-1, 2**63])`` is a float64 array holding 2**63, ``[0.0, 2**53 + 1]`` rounds
    the int, and ``[True, 5]`` quietly becomes ``[1, 5]``. A flat list or tuple is therefore
    checked element by element; other array-likes go through ``np.asarray`` and the array rules.
    """
    is_list = isinstance(token_ids, (list, tuple))
    try:
        ids = np.asarray(token_ids)
    except MemoryError:
        raise
    except (OverflowError, ValueError) as exc:
        if is_list:  # ragged, or an int too wide for any dtype: the right kind, a wrong value
            raise ValueError(
                f"{name} could not be read as a 1-D array of token ids: {exc}"
            ) from None
        raise _unconvertible(token_ids, name, exc) from None
    except Exception as exc:  # an __array__ or buffer that raises: not token ids as given
        raise _unconvertible(token_ids, name, exc) from None
    if ids.ndim == 0 and ids.dtype.kind in "OSUV":
        # A str, bytes, generator, set, None...: NumPy wraps it whole in a 0-d array, which is
        # not a wrong shape but the wrong kind of thing.
        hint = ""
        if isinstance(token_ids, Iterator):
            hint = "; an iterator has no length: pass list(it) or np.fromiter(it, np.int64)"
        raise TypeError(
            f"{name} must be a sequence or array of token ids, got {type(token_ids).__name__}{hint}"
        )
    if not is_list or ids.ndim != 1:
        return ids
    if ids.dtype.kind in "iu" and ids.dtype != np.uint64:
        for i, value in enumerate(token_ids):
            if isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{name}[{i}] is a bool ({value!r}); token ids must be integers")
        # int64 as documented, even when NumPy infers a narrower dtype from NumPy scalars
        # ([np.int8(0)] is int8): the dtype decides which eos values are token ids.
        return ids.astype(np.int64, copy=False)
    return _checked_python_ints(token_ids, name)


def _unconvertible(token_ids: Any, name: str, error: Exception) -> TypeError:
    hint = ""
    if getattr(token_ids, "requires_grad", False):
        hint = "; it requires grad: pass .detach()"
    return TypeError(
        f"{name} ({type(token_ids).__name__}) could not be converted to a NumPy array: "
        f"{type(error).__name__}: {error}{hint}"
    )


def _checked_python_ints(values: Any, name: str) -> np.ndarray:
    out = np.empty(len(values), dtype=np.int64)
    for i, value in enumerate(values):
        # The range is checked on the exact int: comparing a float16 scalar with 2**63 overflows
        # (a RuntimeWarning), and float() would round a longdouble 2**63 - 1 up.
        as_int = exact_int(value, f"{name}[{i}]")
        if not INT64_MIN <= as_int <= INT64_MAX:
            raise ValueError(f"{name}[{i}] = {shown(as_int)} is outside the int64 range")
        out[i] = as_int
    return out


def _native_contiguous(ids: np.ndarray) -> np.ndarray:
    if not ids.dtype.isnative:
        ids = ids.astype(ids.dtype.newbyteorder("="))
    return np.ascontiguousarray(ids)


def _integer_tokens(ids: np.ndarray, name: str) -> np.ndarray:
    if ids.dtype.newbyteorder("=") not in KERNEL_DTYPES:
        ids = ids.astype(np.int64)
    ids = _native_contiguous(ids)
    if ids.dtype == np.uint64:
        for chunk in chunks(ids):
            high = int(chunk.max())
            if high > INT64_MAX:
                raise ValueError(
                    f"{name} contains values outside the int64 range: max={high} > {INT64_MAX}"
                )
    return ids


def _float_tokens(ids: np.ndarray, name: str) -> np.ndarray:
    out = np.empty(ids.shape[0], dtype=np.int64)
    # Both bounds are powers of two, exact in every float dtype wide enough to reach them; a
    # narrower dtype (float16) cannot hold an out-of-range value at all.
    check_range = float(np.finfo(ids.dtype).max) >= _FLOAT_INT64_HIGH
    low = np.asarray(_FLOAT_INT64_LOW, dtype=ids.dtype) if check_range else None
    high = np.asarray(_FLOAT_INT64_HIGH, dtype=ids.dtype) if check_range else None
    start = 0
    for chunk in chunks(ids):
        if not np.all(np.isfinite(chunk)):
            raise ValueError(
                f"{name} contains non-finite values (NaN/inf); token ids must be finite integers"
            )
        if not np.array_equal(chunk, np.trunc(chunk)):
            raise ValueError(
                f"{name} contains non-integer (fractional) values; token ids must be exact integers"
            )
        if check_range and (np.any(chunk < low) or np.any(chunk >= high)):
            raise ValueError(
                f"{name} contains values outside the int64 range "
                f"(min={chunk.min()!r}, max={chunk.max()!r})"
            )
        out[start : start + chunk.shape[0]] = chunk
        start += chunk.shape[0]
    return out


def chunks(ids: np.ndarray) -> Iterator[np.ndarray]:
    """Consecutive views of ``ids``, ``SCAN_CHUNK`` elements each (the last one shorter)."""
    for start in range(0, ids.shape[0], SCAN_CHUNK):
        yield ids[start : start + SCAN_CHUNK]


def value_range(
    ids: np.ndarray, progress: Callable[[float], None] | None = None
) -> tuple[int, int] | None:
    """Smallest and largest value of a 1-D array (None when empty), scanned chunk by chunk.

    A memory map is paged through, never copied; ``progress`` gets the fraction done after each
    chunk.
    """
    if ids.shape[0] == 0:
        return None
    low = high = int(ids[0])
    done = 0
    for chunk in chunks(ids):
        low, high = min(low, int(chunk.min())), max(high, int(chunk.max()))
        done += chunk.shape[0]
        if progress is not None:
            progress(done / ids.shape[0])
    return low, high


# ---------------------------------------------------------------------------------------------
# The reference generator's controls, in its order


def stream_controls(
    block: Any, batch_size: Any, epochs: Any, shuffle: Any, seed: Any
) -> tuple[int, int, int, bool, int]:
    """Validate ``block, batch_size, epochs, shuffle, seed`` exactly as both paths must."""
    return (
        positive_int(block, "block"),
        positive_int(batch_size, "batch_size"),
        nonnegative_int(epochs, "epochs"),
        exact_bool(shuffle, "shuffle"),
        seed_int(seed, "seed"),
    )
