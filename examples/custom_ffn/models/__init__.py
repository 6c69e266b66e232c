"""Models of the custom_ffn example; fairseq also imports every module here for --user-dir."""
