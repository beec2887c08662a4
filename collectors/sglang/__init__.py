"""The SGLang sidecar: poll ``/server_info``, drive traffic, write Parquet."""
