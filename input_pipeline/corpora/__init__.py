"""Raw corpora → documents (lists of sentences): text files, Wikipedia XML dumps, TFDS; sentence splitting."""
