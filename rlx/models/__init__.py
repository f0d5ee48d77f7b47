"""Model builders: BERT-family encoders and the sentence embedder; LLaMA-family decoders from GGUF files.

>>> from rlx.models import BertConfig
>>> BertConfig(vocab_size=10, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16).head_dim
4
"""

from rlx.models.bert import BertConfig, bert_hir, build_bert
from rlx.models.causal_lm import CausalLM, Generation, KvCache
from rlx.models.decoder_config import DecoderConfig
from rlx.models.embedder import SentenceEmbedder
from rlx.models.gguf import GgufModel, GgufTensor, read_gguf
from rlx.models.gguf_tokenizer import GgufTokenizer

__all__ = ["BertConfig", "CausalLM", "DecoderConfig", "Generation", "GgufModel", "GgufTensor", "GgufTokenizer",
           "KvCache", "SentenceEmbedder", "bert_hir", "build_bert", "read_gguf"]
