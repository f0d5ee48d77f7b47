"""Activations in each language, from the one table (`rlx.ir.activation_table`, templates/activations.toml).

The templates call `activations.call(lang, fn, arg)` for an activation step or epilogue, and render each
formula activation's functions from `activations.body(lang, fn)`; `install` makes the object a global of a
template environment. Languages: `c_f` / `c_d` (the CPU's f32 / f64 code), `c_int` (the CPU on integers),
`cuda` (overloaded float / double functions; `cuda_f` / `cuda_d` type a formula's literals) and `metal`.

A formula is parsed (`+ - * /`, unary minus, parentheses, decimal literals, calls) and rendered with each
language's names: a call to another activation becomes that activation's call in the language, `min` / `max`
the language's NaN-propagating rlx_min / rlx_max, a literal gets the precision of the code it is in.

>>> acts = Activations()
>>> acts.call("c_f", "silu", "v1"), acts.call("cuda", "neg", "v1"), acts.call("c_int", "abs", "v2")
('rlx_silu_f(v1)', '(-v1)', 'v2 < 0 ? -v2 : v2')
>>> acts.body("c_f", "hardswish")
'x * rlx_min_f(rlx_max_f(x + 3.0f, 0.0f), 6.0f) * 0.16666666666666666f'
>>> acts.body("cuda_d", "mish"), acts.body("metal", "mish")
('x * tanh(rlx_softplus(x))', 'x * tanh(rlx_softplus(x))')
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import jinja2

from rlx.errors import BuildError, IRError
from rlx.ir.activation_table import ActivationDef, ActivationTable, activation_table

#: Call languages (besides c_int) -> the suffix of the default function rlx_<name><suffix>.
_CALLS = {"c_f": "_f", "c_d": "_d", "cuda": "", "metal": ""}
#: Formula languages -> the call language and the literals' suffix.
_BODIES = {"c_f": ("c_f", "f"), "c_d": ("c_d", ""), "cuda_f": ("cuda", "f"), "cuda_d": ("cuda", ""),
           "metal": ("metal", "f")}
#: A formula's primitives: name -> (arity, the function per call language).
_PRIMITIVES = {"min": (2, {"c_f": "rlx_min_f", "c_d": "rlx_min_d", "cuda": "rlx_min", "metal": "rlx_min"}),
               "max": (2, {"c_f": "rlx_max_f", "c_d": "rlx_max_d", "cuda": "rlx_max", "metal": "rlx_max"})}

_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)|([A-Za-z_]\w*)|([-+*/(),]))")
_ATOM = re.compile(r"[A-Za-z_]\w*|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?[f]?")
_X = re.compile(r"\bx\b")


@dataclass(frozen=True)
class _Rendered:
    text: str
    #: An identifier, literal, call or parenthesized expression: safe as an operand anywhere.
    atomic: bool


def _literal(number: str, suffix: str) -> str:
    if not any(c in number for c in ".eE"):
        number += ".0"
    elif number.endswith("."):
        number += "0"
    return number + suffix


class _Formula:
    """A recursive-descent reader of one formula that renders it in language `lang` as it reads."""

    def __init__(self, acts: Activations, owner: str, text: str, lang: str) -> None:
        self.acts, self.owner, self.text = acts, owner, text
        self.call_lang, self.suffix = _BODIES[lang]
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text.rstrip()):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                raise self.error(f"unexpected {text[pos:].strip()[:10]!r}")
            kind = "num" if m.group(1) else "name" if m.group(2) else "op"
            self.tokens.append((kind, m.group(m.lastindex or 0)))
            pos = m.end()
        self.pos = 0

    def error(self, why: str) -> BuildError:
        return BuildError(f"templates/activations.toml: the formula of {self.owner!r} ({self.text!r}): {why}")

    def peek(self) -> str:
        return self.tokens[self.pos][1] if self.pos < len(self.tokens) else ""

    def take(self, want: str | None = None) -> tuple[str, str]:
        if self.pos >= len(self.tokens) or (want is not None and self.tokens[self.pos][1] != want):
            raise self.error(f"expected {want or 'more'!r}")
        self.pos += 1
        return self.tokens[self.pos - 1]

    def render(self) -> str:
        out = self.sum()
        if self.pos != len(self.tokens):
            raise self.error(f"unexpected {self.peek()!r}")
        return out.text

    def sum(self) -> _Rendered:
        out = self.product()
        while self.peek() in ("+", "-"):
            op = self.take()[1]
            out = _Rendered(f"{out.text} {op} {self.product().text}", False)
        return out

    def product(self) -> _Rendered:
        out = self.unary()
        while self.peek() in ("*", "/"):
            op = self.take()[1]
            out = _Rendered(f"{out.text} {op} {self.unary().text}", False)
        return out

    def unary(self) -> _Rendered:
        if self.peek() == "-":
            self.take()
            return _Rendered("-" + self.unary().text, False)
        return self.primary()

    def primary(self) -> _Rendered:
        kind, tok = self.take()
        if kind == "num":
            return _Rendered(_literal(tok, self.suffix), True)
        if tok == "(":
            inner = self.sum()
            self.take(")")
            return _Rendered(f"({inner.text})", True)
        if kind != "name":
            raise self.error(f"unexpected {tok!r}")
        if tok == "x":
            return _Rendered("x", True)
        self.take("(")
        args = [self.sum()]
        while self.peek() == ",":
            self.take()
            args.append(self.sum())
        self.take(")")
        if tok in _PRIMITIVES:
            arity, names = _PRIMITIVES[tok]
            if len(args) != arity:
                raise self.error(f"{tok} takes {arity} arguments")
            return _Rendered(f"{names[self.call_lang]}({', '.join(a.text for a in args)})", True)
        if len(args) != 1:
            raise self.error(f"activation {tok} takes one argument")
        try:
            callee = self.acts.table.entry(tok)
        except IRError as exc:
            raise self.error(f"{tok!r} is neither an activation nor a primitive (min, max)") from exc
        if callee.formula and callee.id >= self.acts.table.entry(self.owner).id:
            raise self.error(f"it calls {tok!r}, whose function is defined after it (table order)")
        return self.acts.rendered_call(self.call_lang, tok, args[0])


class Activations:
    """The activation table as the templates use it (a global `activations` of their environments)."""

    def __init__(self, table: ActivationTable | None = None) -> None:
        self.table = table or activation_table()

    @property
    def entries(self) -> tuple[ActivationDef, ...]:
        return self.table.entries

    @property
    def formulas(self) -> tuple[ActivationDef, ...]:
        return self.table.formulas

    def enum(self, fn: str | None) -> str:
        return self.table.enum(fn)

    def call(self, lang: str, fn: str, arg: str) -> str:
        """Activation `fn` of `arg` (an identifier or any expression) in call language `lang`."""
        return self.rendered_call(lang, fn, _Rendered(arg, bool(_ATOM.fullmatch(arg)))).text

    def rendered_call(self, lang: str, fn: str, arg: _Rendered) -> _Rendered:
        try:
            entry = self.table.entry(fn)
        except IRError as exc:
            raise BuildError(f"no activation {fn!r} in templates/activations.toml") from exc
        if lang == "c_int":
            if not entry.c_int:
                raise BuildError(f"activation {fn!r} has no integer form (c_int) in templates/activations.toml")
            pattern = entry.c_int
        elif lang not in _CALLS:
            raise BuildError(f"no activation language {lang!r}; expected c_int or one of {sorted(_CALLS)}")
        else:
            override = {"cuda": entry.cuda, "metal": entry.metal}.get(lang, "")
            pattern = override or f"rlx_{fn}{_CALLS[lang]}(x)"
        call_like = re.fullmatch(r"\w+\(x\)", pattern) is not None
        atomic = call_like or (pattern.startswith("(") and pattern.endswith(")"))
        operand = arg.text if arg.atomic or call_like else f"({arg.text})"
        return _Rendered(_X.sub(lambda _: operand, pattern), atomic)

    def body(self, lang: str, fn: str) -> str:
        """The expression of `x` that formula activation `fn`'s function returns in `lang` (see `_BODIES`)."""
        entry = self.table.entry(fn)
        if not entry.formula:
            raise BuildError(f"activation {fn!r} has no formula (each backend writes its function)")
        return _Formula(self, fn, entry.formula, lang).render()


def install(env: jinja2.Environment) -> jinja2.Environment:
    """Make the table the global `activations` of `env` (the CPU, CUDA and Metal environments)."""
    env.globals["activations"] = Activations()
    return env
