#!/usr/bin/env bash
# Stands in for Bazel's coverage tools, which are downloaded; podlab's Bazel setup is offline.
echo "podlab: 'bazel coverage' is not supported offline (third_party/remote_coverage_tools is a stand-in)" >&2
exit 1
