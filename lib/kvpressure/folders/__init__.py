"""Run folders: the layout of a report's folder, the output folders the kit owns, and which run the notebooks read."""
