"""python -m numkong: placeholder, replaced below."""
