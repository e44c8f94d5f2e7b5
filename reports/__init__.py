"""LoadGen logs and run metrics turned into pandas tables, plots, HTML and Markdown."""
