"""Object storage (docs/storage.md): ``s3://`` URLs, the ``storage:`` config and the one S3 client.

Only controller/storage/s3.py imports boto3/botocore and translates their errors into ours; nothing
here runs on import.
"""
