"""Tokenizers: WordPiece (TF ops), RoBERTa's byte-level BPE (vocab.json + merges.txt, or a Hugging
Face tokenizer.json such as ModernBERT's), SentencePiece; vocabulary files;
learning a WordPiece vocabulary; `factory.load_tokenizer` picks one for a vocabulary file."""
