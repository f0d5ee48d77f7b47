"""Model builders: BERT-family encoders and the sentence embedder; decoders from GGUF files and Hugging Face
checkpoints (`CausalLM.from_gguf`, `CausalLM.from_pretrained`).

>>> from rlx.models import BertConfig
>>> BertConfig(vocab_size=10, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16).head_dim
4

The decoder side (`CausalLM`, the GGUF reader and tokenizer) loads on first use, so embedding
sentences does not pay for it.
"""

from rlx.lazy import lazy_names
from rlx.models.bert import BertConfig, bert_hir, build_bert
from rlx.models.embedder import SentenceEmbedder

#: Public names that load on first use: name -> module.
_LAZY = {
    "CausalLM": "rlx.models.causal_lm",
    "Generation": "rlx.models.causal_lm",
    "KvCache": "rlx.models.causal_lm",
    "DecoderConfig": "rlx.models.decoder_config",
    "GgufModel": "rlx.models.gguf",
    "GgufTensor": "rlx.models.gguf",
    "read_gguf": "rlx.models.gguf",
    "GgufTokenizer": "rlx.models.gguf_tokenizer",
}


__getattr__, __dir__ = lazy_names(globals(), _LAZY, cache=True)


__all__ = ["BertConfig", "CausalLM", "DecoderConfig", "Generation", "GgufModel", "GgufTensor", "GgufTokenizer",
           "KvCache", "SentenceEmbedder", "bert_hir", "build_bert", "read_gguf"]
