"""The readable report: the page, its sentences, its figures and the reader's check of it."""
