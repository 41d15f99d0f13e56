"""Stand-in for rules_proto's //proto:defs.bzl: Bazel's built-in proto rules under the same names."""

ProtoInfo = ProtoInfo  # buildifier: disable=native-proto

def proto_lang_toolchain(**attrs):
    native.proto_lang_toolchain(**attrs)

def proto_library(**attrs):
    native.proto_library(**attrs)
