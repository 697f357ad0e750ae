"""TLS: certificates (generated or given), the files each node gets, rotation and the audit."""
