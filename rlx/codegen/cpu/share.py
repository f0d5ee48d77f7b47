"""One C function per distinct kernel: nodes whose code differs only in where their tensors live share it.

A 30-layer decoder renders ~450 node functions, but every layer's node of one kind
runs the same code on different buffers. Compiling each copy costs the C compiler
most of a minute; sharing the code costs one pointer table per call. After the
template renders, each node function's body has its buffer addresses (arena,
param, input, output and constant pointers) and its node label replaced by
parameters; bodies that are then identical become one `rlx_kernel_N`, and each
node keeps a small function (with its op comment) that passes its own pointers.
A body used by one node only is left as it was.

>>> src = '''/* %1 a */
... static int rlx_op_1(rlx_ctx *restrict ctx, const int64_t *restrict sym, const void *const *in, void *const *out)
... {
...     float *y = ((float *)(ctx->arena + 64));
...     return 0;
... }
... /* %2 b */
... static int rlx_op_2(rlx_ctx *restrict ctx, const int64_t *restrict sym, const void *const *in, void *const *out)
... {
...     float *y = ((float *)(ctx->arena + 128));
...     return 0;
... }
... '''
>>> out = share_kernels(src)
>>> out.count("float *y ="), out.count("return rlx_kernel_0(ctx, sym, in, out, bp, NULL);")
(1, 2)
"""

from __future__ import annotations

import re

_FUNC = re.compile(
    r"^static int (rlx_op_\d+)\(rlx_ctx \*restrict ctx, const int64_t \*restrict sym, const void \*const \*in, "
    r"void \*const \*out\)\n\{\n(.*?)^\}\n", re.S | re.M)
#: Buffer address expressions `rlx.codegen.cpu.emit.CpuEmitter.base` produces (the only per-node pointers).
_POINTER = re.compile(r"\(ctx->(?:arena|params) \+ \d+\)|ctx->arena\b|\(\(const char \*\)in\[\d+\]\)"
                      r"|\(\(char \*\)out\[\d+\]\)|\(\(const char \*\)rlx_const_\d+\)")
#: The node's label string (`"%12 matmul (name)"`), used in its error messages.
_LABEL = re.compile(r'"%\d+ [^"\\]*(?:\\.[^"\\]*)*"')
_SIGNATURE = ("rlx_ctx *restrict ctx, const int64_t *restrict sym, const void *const *in, void *const *out")


def _canonical(body: str) -> tuple[str, list[str], str | None]:
    """The body with its pointers as `bp[i]` and its label as `lbl`; the pointers and the label."""
    pointers: list[str] = []
    index: dict[str, int] = {}

    def pointer(m: re.Match[str]) -> str:
        text = m.group(0)
        if text not in index:
            index[text] = len(pointers)
            pointers.append(text)
        return f"bp[{index[text]}]"

    labels = set(_LABEL.findall(body))
    if len(labels) > 1:
        return body, [], None  # not a plain node body: leave it alone
    label = labels.pop() if labels else None
    text = _POINTER.sub(pointer, body)
    if label is not None:
        text = text.replace(label, "lbl")
    return text, pointers, label


def share_kernels(source: str) -> str:
    """`source` with node functions that differ only in buffer addresses sharing one body."""
    funcs = list(_FUNC.finditer(source))
    canon = [_canonical(m.group(2)) for m in funcs]
    users: dict[str, list[int]] = {}
    for i, (text, _, _) in enumerate(canon):
        users.setdefault(text, []).append(i)
    shared = {text: k for k, text in enumerate(t for t, idx in users.items() if len(idx) > 1)}
    if not shared:
        return source
    out: list[str] = []
    pos = 0
    emitted: set[str] = set()
    for i, m in enumerate(funcs):
        text, pointers, label = canon[i]
        if text not in shared:
            continue
        k = shared[text]
        out.append(source[pos:m.start()])
        pos = m.end()
        if text not in emitted:
            emitted.add(text)
            names = ", ".join(funcs[j].group(1) for j in users[text])
            out.append(f"/* shared by {len(users[text])} nodes ({names}): their code differs only in buffer "
                       f"addresses (bp[]) and label (lbl) */\n"
                       f"static int rlx_kernel_{k}({_SIGNATURE}, char *const *restrict bp, const char *lbl)\n"
                       f"{{\n    (void)bp; (void)lbl;\n{text}}}\n\n")
        table = ", ".join(f"(char *){p}" for p in pointers) or "NULL"
        out.append(f"static int {m.group(1)}({_SIGNATURE})\n{{\n"
                   f"    char *const bp[] = {{{table}}};\n"
                   f"    return rlx_kernel_{k}(ctx, sym, in, out, bp, {label or 'NULL'});\n}}\n")
    out.append(source[pos:])
    return "".join(out)
