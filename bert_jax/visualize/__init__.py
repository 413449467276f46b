"""Attention you can see: a checkpoint's attention on a text as a self-contained HTML page (head and
model views) and PNG heat-maps. `html.attention_page` is the one call a server needs."""
