"""perftracker.streams"""
