"""rlx.codegen: a decided LIR rendered into one source file per backend.

One package per backend (`cpu`, `cuda`, `metal`), each with its emitter, its rule modules and a
`rule_table()` made from them; the shared pieces (`registry`, `backends`, `common`, `activations`,
`region_steps`, `template_cache`, `sample_args`) live here. Importing a module registers nothing.
"""
