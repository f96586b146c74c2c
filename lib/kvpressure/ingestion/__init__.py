"""ingestion"""
