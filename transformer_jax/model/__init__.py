"""Flax modules and ModelConfig: attention, positions, the shared blocks and the three families.

Where each part of the paper lives:

  §3.2.1 softmax(QKᵀ/√d_k)V          attention.dot_product_attention (plain, xla, chunked, pallas, cudnn)
  §3.2.2 multi-head, separate d_k/d_v  attention.MultiHeadAttention (config d_k, d_v)
  §3.2.3 padding and causal masks     masking.AttentionMask (padding, causal, packing segments, prefix)
  §3.3   ReLU feed-forward            layers.FeedForward
  §3.4   shared embeddings ×√d_model, tied pre-softmax   layers.EmbedTokens, layers.attend
  §3.5   sinusoidal positions (Table 3 (E): learned)     positions.PositionalEncoding
  §5.4   residual dropout, post-LN (pre-LN optional)     layers.SublayerConnection, dropout.Dropout
  §3.1   encoder-decoder                                 transformer.Transformer
  descendants: decoder_only.DecoderOnly (GPT-style), encoder_only.EncoderOnly (BERT-style)
  beyond the paper: O(n·block) attention (chunked_attention.py), Pallas flash kernels
    (flash_attention.py), bf16 matmul operands with float32 accumulation (precision.py)
"""
