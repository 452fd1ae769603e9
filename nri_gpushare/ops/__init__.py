"""Operators' commands: installing, enabling and watching nri-gpushare on a node."""
