"""Flax modules and ModelConfig: attention, positions, the shared blocks and the three families.

Where each part of the paper lives:

  §3.2.1 softmax(QKᵀ/√d_k)V          attention.dot_product_attention ("xla"/"cudnn": jax.nn's)
  §3.2.2 multi-head, separate d_k/d_v  attention.MultiHeadAttention (config d_k, d_v)
  §3.2.3 padding and causal masks     attention.padding_mask, causal_mask, segment_mask (packing)
  §3.3   ReLU feed-forward            layers.FeedForward
  §3.4   shared embeddings ×√d_model, tied pre-softmax   layers.EmbedTokens, layers.attend
  §3.5   sinusoidal positions (Table 3 (E): learned)     positions.PositionalEncoding
  §5.4   residual dropout, post-LN (pre-LN optional)     layers.SublayerConnection, dropout.Dropout
  §3.1   encoder-decoder                                 transformer.Transformer
  descendants: decoder_only.DecoderOnly (GPT-style), encoder_only.EncoderOnly (BERT-style)
  beyond the paper: bf16 matmul operands with float32 accumulation (precision.py)
"""
