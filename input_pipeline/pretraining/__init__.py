"""Pre-training data: documents → examples (NSP/SOP, `examples`, `featurize`), TFRecord shards
(`shards`), masking, packing, unpadding, the batch layout (`batch`) and the resumable training
input (`dataset`, `synthetic`)."""
