"""edgesched.policies"""
