"""perftracker.collectors"""
