"""Tokenizers: WordPiece (TF ops), RoBERTa's byte-level BPE, SentencePiece; vocabulary files;
learning a WordPiece vocabulary; `factory.load_tokenizer` picks one for a vocabulary file."""
