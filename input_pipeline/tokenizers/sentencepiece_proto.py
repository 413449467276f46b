"""The part of SentencePiece's ``ModelProto`` this project reads, as a protobuf message class built
here from a descriptor, not imported from ``sentencepiece.sentencepiece_model_pb2``.

Why: sentencepiece 0.2.3's generated module refuses to load under a protobuf runtime older than
the 7.x it was generated with (``VersionError`` at import), and Apache Beam (the ``beam`` extra)
pins protobuf < 7. A class built from a descriptor runs on any protobuf the other packages allow.
Only the fields read are declared (field numbers and defaults as in sentencepiece_model.proto);
the rest of a model file parses as unknown fields.

    ModelProto { repeated SentencePiece pieces = 1; optional NormalizerSpec normalizer_spec = 3; }
    SentencePiece { optional string piece = 1; optional float score = 2; optional Type type = 3 [default = NORMAL]; }
    NormalizerSpec { optional string name = 1; }
"""

from __future__ import annotations

import functools

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
PIECE_TYPES = {"NORMAL": 1, "UNKNOWN": 2, "CONTROL": 3, "USER_DEFINED": 4, "UNUSED": 5, "BYTE": 6}


def _field(message, name: str, number: int, kind: int, *, label: int = _F.LABEL_OPTIONAL,
           type_name: str = "", default: str = "") -> None:
    field = message.field.add(name=name, number=number, type=kind, label=label)
    if type_name:
        field.type_name = type_name
    if default:
        field.default_value = default


@functools.cache
def model_proto_class():
    """The ``sentencepiece.ModelProto`` message class (its own descriptor pool: no clash with
    sentencepiece's module if that is loaded too)."""
    f = descriptor_pb2.FileDescriptorProto(name="bert_jax_sentencepiece_model.proto", package="sentencepiece",
                                           syntax="proto2")
    model = f.message_type.add(name="ModelProto")
    piece = model.nested_type.add(name="SentencePiece")
    kind = piece.enum_type.add(name="Type")
    for name, number in PIECE_TYPES.items():
        kind.value.add(name=name, number=number)
    _field(piece, "piece", 1, _F.TYPE_STRING)
    _field(piece, "score", 2, _F.TYPE_FLOAT)
    _field(piece, "type", 3, _F.TYPE_ENUM, type_name=".sentencepiece.ModelProto.SentencePiece.Type",
           default="NORMAL")
    normalizer = f.message_type.add(name="NormalizerSpec")
    _field(normalizer, "name", 1, _F.TYPE_STRING)
    _field(model, "pieces", 1, _F.TYPE_MESSAGE, label=_F.LABEL_REPEATED,
           type_name=".sentencepiece.ModelProto.SentencePiece")
    _field(model, "normalizer_spec", 3, _F.TYPE_MESSAGE, type_name=".sentencepiece.NormalizerSpec")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("sentencepiece.ModelProto"))
