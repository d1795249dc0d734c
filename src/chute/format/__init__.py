"""The on-disk contract: record schema and framing, the manifest and its ``ImageSpec``,
model bundles, and the storage layer every file goes through."""
