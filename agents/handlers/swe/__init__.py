"""The `swe` handler (`handler`) and its helpers: repository provisioning (`repo`), images
(`images`), the agent's diff (`diff`), the EVAL test run (`evaluate`) and its guard (`guard`)."""
