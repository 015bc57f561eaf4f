"""perftracker.sinks.alerts"""
