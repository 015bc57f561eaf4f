"""perftracker.sinks"""
