"""Builds the documentation site: MkDocs hooks and the reference pages generated from the code."""
