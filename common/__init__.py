"""Pieces shared by every minibroker process: error codes, clock, config, logging, wire codec."""
