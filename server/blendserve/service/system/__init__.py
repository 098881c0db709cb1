"""Health and model listing."""
