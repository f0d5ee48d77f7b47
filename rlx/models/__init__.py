"""Model builders: BERT-family encoders and the sentence embedder on top of them.

>>> from rlx.models import BertConfig
>>> BertConfig(vocab_size=10, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16).head_dim
4
"""

from rlx.models.bert import BertConfig, bert_hir, build_bert
from rlx.models.embedder import SentenceEmbedder

__all__ = ["BertConfig", "SentenceEmbedder", "bert_hir", "build_bert"]
